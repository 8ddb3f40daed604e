"""Settings for the whole test session.

``flowmq serve`` runs one broker process per core by default (host mode, docs/operations.md
"Host mode").  The brokers the tests start, in-process or as ``flowmq serve`` subprocesses
(which inherit this environment), are single processes unless a test asks for more with
``--processes`` (tests/integration/test_host_mode.py): set here once, rather than in every
fixture, and whatever the developer's environment says.
"""

import os

os.environ["FLOWMQ_PROCESSES"] = "1"
