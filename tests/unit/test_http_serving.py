"""Streamable HTTP keeps DNS-rebinding protection on every host, and slow clients cannot hold the server: the pure checks.

The checks on real files, servers and processes: tests/integration/test_http_serving.py.
"""

from __future__ import annotations

import pytest

from pollwarden.core.errors import ConfigError
from pollwarden.surface.http_serve import HttpOptions, is_loopback, transport_security


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "127.255.255.254", "::1", "[::1]", "localhost"])
def test_all_of_127_0_0_0_8_and_ipv6_loopback_count_as_loopback(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.5", "::", "mcp.example.com", "128.0.0.1"])
def test_other_hosts_are_not_loopback(host: str) -> None:
    assert not is_loopback(host)


def test_beyond_loopback_the_protection_stays_on_with_exactly_the_names_given() -> None:
    settings = transport_security(
        HttpOptions(
            host="0.0.0.0",
            allow_non_loopback=True,
            allowed_hosts=("mcp.example.com", "mcp.example.com:8443"),
            allowed_origins=("https://app.example.com",),
            verifier_configured=True,
        )
    )
    assert settings.enable_dns_rebinding_protection
    assert settings.allowed_hosts == ["mcp.example.com", "mcp.example.com:*", "mcp.example.com:8443"]
    assert settings.allowed_origins == ["https://app.example.com"]


def test_beyond_loopback_without_a_host_list_or_without_asking_is_refused() -> None:
    with pytest.raises(ConfigError, match="needs the names clients use"):
        transport_security(HttpOptions(host="0.0.0.0", allow_non_loopback=True))
    with pytest.raises(ConfigError, match="not a loopback address"):
        transport_security(HttpOptions(host="10.0.0.5", allowed_hosts=("mcp.example.com",)))
    with pytest.raises(ConfigError, match="--allowed-host '\\*'"):
        transport_security(HttpOptions(host="0.0.0.0", allow_non_loopback=True, allowed_hosts=("*",)))
    with pytest.raises(ConfigError, match="--allowed-origin"):
        transport_security(HttpOptions(allowed_origins=("app.example.com/x",)))
