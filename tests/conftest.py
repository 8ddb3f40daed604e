"""Settings for the whole test session.

``flowmq serve`` can run several broker processes behind one set of ports (host mode,
docs/operations.md "Host mode"; one process is the default today, one per core may become
it).  The brokers the tests start, in-process or as ``flowmq serve`` subprocesses (which
inherit this environment), are single processes unless a test asks for more with
``--processes`` (tests/integration/test_host_mode.py): set here once, rather than in every
fixture, whatever the default and the developer's environment say.
"""

import os

from hypothesis import HealthCheck, settings

os.environ["FLOWMQ_PROCESSES"] = "1"

# Property tests generate their inputs on machines that may be busy (CI runs the suite on
# every core): slow generation is not a failure; example counts stay set per test.
settings.register_profile("flowmq", suppress_health_check=[HealthCheck.too_slow], deadline=None)
settings.load_profile("flowmq")
