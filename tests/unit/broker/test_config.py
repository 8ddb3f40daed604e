import pytest

from flowmq_core.config import BrokerConfig, ConfigError, load_config


def test_defaults_are_the_embedded_profile():
    cfg = load_config({}, env={}).resolved()
    assert cfg.http_port == 8080 and cfg.mqtt_port == 1883 and cfg.kafka_port == 9092
    assert cfg.amqp_port == 5672 and cfg.gossip_port == 7946
    assert cfg.meta == "sqlite:///data/meta.db"
    assert cfg.objects.startswith("file:///") and cfg.objects.endswith("/data/objects")
    assert cfg.roles == ["mqtt", "kafka", "amqp", "admin"]


def test_flags_beat_env_which_beats_file(tmp_path):
    config_file = tmp_path / "flowmq.toml"
    config_file.write_text(
        'http_port = 1000\nmqtt_port = 1001\nkafka-port = 1002\nroles = ["mqtt"]\n'
    )
    env = {"FLOWMQ_MQTT_PORT": "2001", "FLOWMQ_KAFKA_PORT": "2002"}
    cfg = load_config({"kafka_port": "3002"}, env=env, config_file=str(config_file))
    assert (cfg.http_port, cfg.mqtt_port, cfg.kafka_port) == (1000, 2001, 3002)
    assert cfg.roles == ["mqtt"]


def test_config_file_from_env(tmp_path):
    config_file = tmp_path / "c.toml"
    config_file.write_text('node_id = "n1"\nseeds = "a:1, b:2"\n')
    cfg = load_config({}, env={"FLOWMQ_CONFIG": str(config_file)})
    assert cfg.node_id == "n1" and cfg.seeds == ["a:1", "b:2"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"http_port": "eighty"}, "--http-port"),
        ({"http_port": "70000"}, "http_port must be 0..65535"),
        ({"roles": "mqtt,smtp"}, "roles must be a non-empty subset"),
        ({"log_level": "loud"}, "log_level"),
    ],
)
def test_bad_values_are_named(flags, message):
    with pytest.raises(ConfigError, match=message):
        load_config(flags, env={})


def test_unknown_file_key_and_bad_toml(tmp_path):
    bad_key = tmp_path / "a.toml"
    bad_key.write_text("htp_port = 1\n")
    with pytest.raises(ConfigError, match="unknown key 'htp_port'"):
        load_config({}, env={}, config_file=str(bad_key))
    bad_toml = tmp_path / "b.toml"
    bad_toml.write_text("http_port = = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config({}, env={}, config_file=str(bad_toml))
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config({}, env={}, config_file=str(tmp_path / "missing.toml"))


def test_absolute_data_dir_gives_absolute_urls():
    cfg = BrokerConfig(data_dir="/var/lib/flowmq").resolved()
    assert cfg.meta == "sqlite:////var/lib/flowmq/meta.db"
    assert cfg.objects == "file:///var/lib/flowmq/objects"


@pytest.mark.parametrize(
    ("raw", "value"), [("false", False), ("0", False), ("yes", True), (True, True)]
)
def test_boolean_keys(raw, value):
    assert load_config({"allow_anonymous": raw}, env={}).allow_anonymous is value


def test_bad_boolean_is_named():
    with pytest.raises(ConfigError, match="--allow-anonymous"):
        load_config({"allow_anonymous": "maybe"}, env={})


def test_gossip_timing_is_configurable(tmp_path):
    config_file = tmp_path / "c.toml"
    config_file.write_text("gossip_interval = 0.05\ngossip_suspicion_mult = 2\n")
    env = {"FLOWMQ_GOSSIP_PROBE_INTERVAL": "0.4", "FLOWMQ_GOSSIP_PROBE_TIMEOUT": "0.1"}
    cfg = load_config({"gossip_nodes": "5"}, env=env, config_file=str(config_file))
    assert (cfg.gossip_interval, cfg.gossip_suspicion_mult, cfg.gossip_nodes) == (0.05, 2, 5)
    assert (cfg.gossip_probe_interval, cfg.gossip_probe_timeout) == (0.4, 0.1)
    with pytest.raises(ConfigError, match="gossip_interval"):
        load_config({"gossip_interval": "fast"}, env={})


def test_bind_defaults_to_loopback_and_anonymous_follows_it():
    cfg = load_config({}, env={})
    assert cfg.bind == "127.0.0.1"
    assert cfg.allow_anonymous is None  # unset until resolved
    assert cfg.resolved().allow_anonymous is True


@pytest.mark.parametrize(
    ("bind", "anonymous"),
    [
        ("127.0.0.1", True),
        ("127.0.0.53", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
    ],
)
def test_unset_allow_anonymous_is_true_only_on_loopback(bind, anonymous):
    assert load_config({"bind": bind}, env={}).resolved().allow_anonymous is anonymous


@pytest.mark.parametrize("explicit", [True, False])
def test_explicit_allow_anonymous_wins_over_bind(explicit):
    for bind in ("127.0.0.1", "0.0.0.0"):
        cfg = load_config({"bind": bind, "allow_anonymous": str(explicit)}, env={})
        assert cfg.resolved().allow_anonymous is explicit


def test_bind_from_env_toml_and_flag(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('bind = "0.0.0.0"\nallow_anonymous = true\n')
    from_file = load_config({}, env={}, config_file=str(toml))
    assert (from_file.bind, from_file.allow_anonymous) == ("0.0.0.0", True)
    env = {"FLOWMQ_BIND": "::", "FLOWMQ_ALLOW_ANONYMOUS": "false"}
    from_env = load_config({}, env=env)
    assert (from_env.bind, from_env.allow_anonymous) == ("::", False)
    assert load_config({"bind": "10.1.2.3"}, env=env).bind == "10.1.2.3"


def test_localhost_binds_the_ipv4_loopback_address():
    assert load_config({"bind": "localhost"}, env={}).resolved().bind == "127.0.0.1"


@pytest.mark.parametrize("bind", ["example.com", "256.0.0.1", ""])
def test_bad_bind_is_named(bind):
    with pytest.raises(ConfigError, match="bind must be an IP address"):
        load_config({"bind": bind}, env={})


@pytest.mark.parametrize(
    ("flags", "default"),
    [
        ({}, "allow"),  # loopback: anonymous allowed
        ({"bind": "0.0.0.0"}, "deny"),  # anonymous refused
        ({"bind": "0.0.0.0", "allow_anonymous": "true"}, "allow"),
        ({"allow_anonymous": "false"}, "deny"),
        ({"acl_default": "DENY"}, "deny"),
        ({"bind": "0.0.0.0", "acl_default": "allow"}, "allow"),
    ],
)
def test_acl_default_follows_allow_anonymous_unless_set(flags, default):
    assert load_config(flags, env={}).resolved().acl_default == default


def test_acl_default_is_allow_or_deny():
    with pytest.raises(ConfigError, match="acl_default"):
        load_config({"acl_default": "maybe"}, env={})
    assert load_config({}, env={"FLOWMQ_ACL_DEFAULT": "deny"}).acl_default == "deny"
