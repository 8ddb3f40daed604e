"""FlowMQ-py test suite (a package so shared fixtures import as ``tests.fixtures``)."""
