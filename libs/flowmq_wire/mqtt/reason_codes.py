"""MQTT 5.0 reason codes (§2.4), MQTT 3.1.1 CONNACK/SUBACK return codes, and the mapping between them.

Plain ``int`` constants rather than an ``IntEnum``: the decoder stores whatever byte it read, and
comparing ints is the cheapest thing the broker can do with them. ``reason_code_name`` gives the
spec name for logs.
"""

from __future__ import annotations

# --- MQTT 5.0 reason codes -------------------------------------------------------------------
SUCCESS = 0x00
NORMAL_DISCONNECTION = 0x00
GRANTED_QOS_0 = 0x00
GRANTED_QOS_1 = 0x01
GRANTED_QOS_2 = 0x02
DISCONNECT_WITH_WILL_MESSAGE = 0x04
NO_MATCHING_SUBSCRIBERS = 0x10
NO_SUBSCRIPTION_EXISTED = 0x11
CONTINUE_AUTHENTICATION = 0x18
RE_AUTHENTICATE = 0x19
UNSPECIFIED_ERROR = 0x80
MALFORMED_PACKET = 0x81
PROTOCOL_ERROR = 0x82
IMPLEMENTATION_SPECIFIC_ERROR = 0x83
UNSUPPORTED_PROTOCOL_VERSION = 0x84
CLIENT_IDENTIFIER_NOT_VALID = 0x85
BAD_USER_NAME_OR_PASSWORD = 0x86
NOT_AUTHORIZED = 0x87
SERVER_UNAVAILABLE = 0x88
SERVER_BUSY = 0x89
BANNED = 0x8A
SERVER_SHUTTING_DOWN = 0x8B
BAD_AUTHENTICATION_METHOD = 0x8C
KEEP_ALIVE_TIMEOUT = 0x8D
SESSION_TAKEN_OVER = 0x8E
TOPIC_FILTER_INVALID = 0x8F
TOPIC_NAME_INVALID = 0x90
PACKET_ID_IN_USE = 0x91
PACKET_ID_NOT_FOUND = 0x92
RECEIVE_MAXIMUM_EXCEEDED = 0x93
TOPIC_ALIAS_INVALID = 0x94
PACKET_TOO_LARGE = 0x95
MESSAGE_RATE_TOO_HIGH = 0x96
QUOTA_EXCEEDED = 0x97
ADMINISTRATIVE_ACTION = 0x98
PAYLOAD_FORMAT_INVALID = 0x99
RETAIN_NOT_SUPPORTED = 0x9A
QOS_NOT_SUPPORTED = 0x9B
USE_ANOTHER_SERVER = 0x9C
SERVER_MOVED = 0x9D
SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
CONNECTION_RATE_EXCEEDED = 0x9F
MAXIMUM_CONNECT_TIME = 0xA0
SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2

# Spec spellings, for readers coming from the standard's text.
CLIENT_ID_NOT_VALID = CLIENT_IDENTIFIER_NOT_VALID
PACKET_IDENTIFIER_IN_USE = PACKET_ID_IN_USE
PACKET_IDENTIFIER_NOT_FOUND = PACKET_ID_NOT_FOUND
SUBSCRIPTION_IDS_NOT_SUPPORTED = SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED

# --- MQTT 3.1.1 return codes -----------------------------------------------------------------
CONNACK_ACCEPTED = 0
CONNACK_UNACCEPTABLE_PROTOCOL_VERSION = 1
CONNACK_IDENTIFIER_REJECTED = 2
CONNACK_SERVER_UNAVAILABLE = 3
CONNACK_BAD_USERNAME_OR_PASSWORD = 4
CONNACK_NOT_AUTHORIZED = 5
SUBACK_FAILURE = 0x80

# --- which codes each v5 packet may carry (spec tables in §3.2.2.2, 3.4.2.1, …) ---------------
CONNACK_REASON_CODES = frozenset(
    {0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C, 0x90}
    | {0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F}
)
PUBACK_REASON_CODES = frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99})
PUBREC_REASON_CODES = PUBACK_REASON_CODES
PUBREL_REASON_CODES = frozenset({0x00, 0x92})
PUBCOMP_REASON_CODES = PUBREL_REASON_CODES
SUBACK_REASON_CODES = frozenset(
    {0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2}
)
UNSUBACK_REASON_CODES = frozenset({0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91})
DISCONNECT_REASON_CODES = frozenset(
    {0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94}
    | {0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2}
)
AUTH_REASON_CODES = frozenset({0x00, 0x18, 0x19})

CONNACK_V311_RETURN_CODES = frozenset(range(6))
SUBACK_V311_RETURN_CODES = frozenset({0, 1, 2, SUBACK_FAILURE})

_NAMES: dict[int, str] = {
    0x00: "Success",
    0x01: "Granted QoS 1",
    0x02: "Granted QoS 2",
    0x04: "Disconnect with Will Message",
    0x10: "No matching subscribers",
    0x11: "No subscription existed",
    0x18: "Continue authentication",
    0x19: "Re-authenticate",
    0x80: "Unspecified error",
    0x81: "Malformed Packet",
    0x82: "Protocol Error",
    0x83: "Implementation specific error",
    0x84: "Unsupported Protocol Version",
    0x85: "Client Identifier not valid",
    0x86: "Bad User Name or Password",
    0x87: "Not authorized",
    0x88: "Server unavailable",
    0x89: "Server busy",
    0x8A: "Banned",
    0x8B: "Server shutting down",
    0x8C: "Bad authentication method",
    0x8D: "Keep Alive timeout",
    0x8E: "Session taken over",
    0x8F: "Topic Filter invalid",
    0x90: "Topic Name invalid",
    0x91: "Packet Identifier in use",
    0x92: "Packet Identifier not found",
    0x93: "Receive Maximum exceeded",
    0x94: "Topic Alias invalid",
    0x95: "Packet too large",
    0x96: "Message rate too high",
    0x97: "Quota exceeded",
    0x98: "Administrative action",
    0x99: "Payload format invalid",
    0x9A: "Retain not supported",
    0x9B: "QoS not supported",
    0x9C: "Use another server",
    0x9D: "Server moved",
    0x9E: "Shared Subscriptions not supported",
    0x9F: "Connection rate exceeded",
    0xA0: "Maximum connect time",
    0xA1: "Subscription Identifiers not supported",
    0xA2: "Wildcard Subscriptions not supported",
}

ALL_REASON_CODES = frozenset(_NAMES)


def reason_code_name(code: int) -> str:
    """The spec's name of a v5 reason code, e.g. ``0x87`` → ``"Not authorized"``."""
    return _NAMES.get(code, f"Unknown reason code 0x{code:02X}")


# A 3.1.1 client only understands return codes 0-5; pick the one whose meaning is closest so
# the client's error message still points at the right cause.
_CONNACK_V5_TO_V311: dict[int, int] = {
    SUCCESS: CONNACK_ACCEPTED,
    UNSUPPORTED_PROTOCOL_VERSION: CONNACK_UNACCEPTABLE_PROTOCOL_VERSION,
    CLIENT_IDENTIFIER_NOT_VALID: CONNACK_IDENTIFIER_REJECTED,
    BAD_USER_NAME_OR_PASSWORD: CONNACK_BAD_USERNAME_OR_PASSWORD,
    BAD_AUTHENTICATION_METHOD: CONNACK_BAD_USERNAME_OR_PASSWORD,
    NOT_AUTHORIZED: CONNACK_NOT_AUTHORIZED,
    BANNED: CONNACK_NOT_AUTHORIZED,
    SERVER_UNAVAILABLE: CONNACK_SERVER_UNAVAILABLE,
    SERVER_BUSY: CONNACK_SERVER_UNAVAILABLE,
    USE_ANOTHER_SERVER: CONNACK_SERVER_UNAVAILABLE,
    SERVER_MOVED: CONNACK_SERVER_UNAVAILABLE,
    CONNECTION_RATE_EXCEEDED: CONNACK_SERVER_UNAVAILABLE,
    QUOTA_EXCEEDED: CONNACK_SERVER_UNAVAILABLE,
}


def connack_v5_to_v311(code: int) -> int:
    """Nearest MQTT 3.1.1 CONNACK return code (0-5) for a v5 CONNACK reason code.

    Codes 0-5 pass through unchanged, so a value that already is a 3.1.1 return code is safe.
    Anything without a closer match becomes 3 (Server unavailable).
    """
    if code <= CONNACK_NOT_AUTHORIZED:
        return code
    return _CONNACK_V5_TO_V311.get(code, CONNACK_SERVER_UNAVAILABLE)


def suback_v5_to_v311(code: int) -> int:
    """3.1.1 SUBACK return code for a v5 SUBACK reason code: granted QoS 0-2 or 0x80 Failure."""
    return code if code <= GRANTED_QOS_2 else SUBACK_FAILURE
