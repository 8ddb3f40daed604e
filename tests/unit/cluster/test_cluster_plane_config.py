"""The cluster plane's config keys: cluster_bind, cluster_secret, cluster_secret_file (their
TOML key, FLOWMQ_ env var and flag derived from the field name like every other key)."""

from __future__ import annotations

import pytest

from flowmq_broker.server import StartupError, _advertised_host, _cluster_advertised_host
from flowmq_broker.server import _cluster_secret as broker_cluster_secret
from flowmq_core.config import BrokerConfig, ConfigError, load_config

SECRET = "a-cluster-secret-of-some-length"


def test_the_plane_is_on_loopback_without_a_secret_by_default():
    config = load_config(env={})
    assert config.cluster_bind == "127.0.0.1"
    assert config.cluster_secret == config.cluster_secret_file == ""
    assert config.read_cluster_secret() == ""
    assert broker_cluster_secret(config) is None  # an open plane, allowed on loopback


def test_every_source_sets_the_keys(tmp_path):
    toml = tmp_path / "flowmq.toml"
    toml.write_text(f'cluster_bind = "10.0.0.5"\ncluster_secret = "{SECRET}-file"\n')
    assert load_config(env={}, config_file=str(toml)).read_cluster_secret() == f"{SECRET}-file"
    env = {"FLOWMQ_CLUSTER_SECRET": f"{SECRET}-env", "FLOWMQ_CLUSTER_BIND": "0.0.0.0"}
    config = load_config(env=env, config_file=str(toml))
    assert (config.cluster_bind, config.read_cluster_secret()) == ("0.0.0.0", f"{SECRET}-env")
    flags = {"cluster_secret": f"{SECRET}-flag", "cluster_bind": "::"}
    config = load_config(flags, env=env, config_file=str(toml))
    assert (config.cluster_bind, config.read_cluster_secret()) == ("::", f"{SECRET}-flag")


def test_the_secret_file_holds_the_secret_stripped(tmp_path):
    path = tmp_path / "secret"
    path.write_text(f"  {SECRET}\n")
    config = load_config({"cluster_secret_file": str(path), "cluster_bind": "0.0.0.0"}, env={})
    assert config.read_cluster_secret() == SECRET
    assert broker_cluster_secret(config) is not None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"cluster_bind": "localhost"}, "cluster_bind must be an IP address"),
        ({"cluster_secret": SECRET, "cluster_secret_file": "/x"}, "not both"),
    ],
)
def test_bad_values_are_named(flags, message):
    with pytest.raises(ConfigError, match=message):
        load_config(flags, env={})


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"cluster_bind": "0.0.0.0"}, "cluster_bind 0.0.0.0 is not loopback"),
        ({"cluster_bind": "10.0.0.5"}, "needs a secret"),
        ({"cluster_secret": "short"}, "at least 16 bytes"),
        ({"cluster_secret_file": "/nonexistent/secret"}, "cannot read cluster_secret_file"),
    ],
)
def test_what_stops_the_broker_is_one_line(flags, message):
    with pytest.raises(StartupError, match=message) as caught:
        broker_cluster_secret(load_config(flags, env={}))
    assert "\n" not in str(caught.value)


def test_an_empty_secret_file_is_refused(tmp_path):
    path = tmp_path / "secret"
    path.write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        load_config({"cluster_secret_file": str(path)}, env={}).read_cluster_secret()


def test_the_secret_is_not_in_the_config_repr():
    assert SECRET not in repr(BrokerConfig(cluster_secret=SECRET))


def test_the_advertised_address_is_reachable_where_the_plane_is_bound():
    assert _cluster_advertised_host("127.0.0.1") == "127.0.0.1"
    assert _cluster_advertised_host("10.0.0.5") == "10.0.0.5"
    assert _cluster_advertised_host("0.0.0.0") == _advertised_host()
