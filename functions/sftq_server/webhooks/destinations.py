"""Where a delivery may go: the URL's form, then every address it resolves to, checked at
every attempt (https only; no private, loopback, link-local or metadata address unless
allow_private, which `sftq dev` sets)."""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit

if TYPE_CHECKING:

    pass

logger = logging.getLogger("sftq.webhooks")

MAX_URL_LENGTH = 2048


class BadUrl(ValueError):
    """The URL is not one we deliver to; the message is for the user."""


class DestinationRefused(Exception):
    """The destination resolves to an address we never connect to; the message is for the user."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # IDNA (ASCII), lower case; an IP literal without brackets
    port: int
    path: str  # path and query, as sent on the request line

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    @property
    def label(self) -> str:
        """Safe to log and show: scheme, host and port, no path or query."""
        return f"{self.scheme}://{self.host_header}"


_CONTROL = re.compile(r"[\x00-\x20\x7f]")


def parse_url(url: str, *, allow_http: bool) -> Target:
    if not isinstance(url, str) or not url:
        raise BadUrl("url must be a non-empty string")
    if len(url) > MAX_URL_LENGTH:
        raise BadUrl(f"url must be at most {MAX_URL_LENGTH} characters")
    if _CONTROL.search(url):
        raise BadUrl("url must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise BadUrl("url is not a valid URL") from None
    scheme = parts.scheme.lower()
    allowed = ("https", "http") if allow_http else ("https",)
    if scheme not in allowed:
        raise BadUrl("url must start with https://" if not allow_http else
                     "url must start with https:// or http://")
    if port == 0:
        raise BadUrl("url's port must be from 1 to 65535")
    if "@" in parts.netloc:
        raise BadUrl("url must not contain a user name or password")
    if parts.fragment or url.endswith("#"):
        raise BadUrl("url must not contain a #fragment")
    host = parts.hostname or ""
    if not host:
        raise BadUrl("url must name a host")
    if not _is_ip(host):
        try:
            host = host.rstrip(".").encode("idna").decode("ascii").lower()
        except UnicodeError:
            raise BadUrl("url's host name is not valid") from None
        if not host or not re.fullmatch(r"[a-z0-9.-]+", host) or ".." in host:
            raise BadUrl("url's host name is not valid")
        # 127.1, 2130706433, 0x7f000001: resolvers read these as IPv4 addresses. No real top
        # level domain is a number, so a numeric last label must be a plain IPv4 address.
        if re.fullmatch(r"0x[0-9a-f]*|[0-9]+", host.rsplit(".", 1)[-1]):
            raise BadUrl("url's host is not a valid address: write an IPv4 address as four "
                         "decimal numbers")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    # The request line is ASCII: percent-encode anything else (existing escapes stay as they are).
    path = quote(path, safe="/%:@!$&'()*+,;=-._~?")
    return Target(scheme, host, port or (443 if scheme == "https" else 80), path)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


Resolver = Callable[[str, int], list[str]]


def system_resolver(host: str, port: int) -> list[str]:
    """Every address the system resolver gives for host (TCP)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise DestinationRefused(f"{host} does not resolve ({exc})") from None
    out: list[str] = []
    for info in infos:
        addr = str(info[4][0])
        if addr not in out:
            out.append(addr)
    return out


# Tests replace this (monkeypatch) so that no test ever asks a real DNS server anything.
default_resolver: Resolver = system_resolver

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_METADATA = frozenset({"169.254.169.254", "169.254.170.2", "100.100.100.200", "192.0.0.192",
                       "fd00:ec2::254"})


def address_refusal(address: str) -> str | None:
    """Why we never connect to this address, or None when it is a public unicast address."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return "not a valid IP address"
    if isinstance(ip, ipaddress.IPv6Address):
        # IPv4 carried inside IPv6 is judged as the IPv4 address it reaches.
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            reason = address_refusal(str(embedded))
            return f"{reason} (inside an IPv6 address)" if reason else None
    if str(ip) in _METADATA:
        return "a cloud metadata address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address (where cloud metadata services live)"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_private:
        return "a private address"
    if ip.is_reserved or not ip.is_global:
        return "not a public address"
    return None


def resolve_checked(target: Target, *, allow_private: bool,
                    resolver: Resolver | None = None) -> list[str]:
    """The addresses to connect to, all checked; DestinationRefused if any one is refused.

    All, not some: a name that answers one public and one private address would otherwise let
    the choice of address decide whether we reach the private one.
    """
    try:
        literal: str | None = str(ipaddress.ip_address(target.host))
    except ValueError:
        literal = None
    if literal is not None:
        addresses = [literal]
    else:
        addresses = (resolver or default_resolver)(target.host, target.port)
        if not addresses:
            raise DestinationRefused(f"{target.host} does not resolve")
    if not allow_private:
        for address in addresses:
            reason = address_refusal(address)
            if reason:
                # For a name, not the address it gave: no map of someone's internal DNS.
                shown = address if literal is not None else f"{target.host} resolves to"
                raise DestinationRefused(f"{shown} {'is ' if literal else ''}{reason}")
    return addresses


def check_destination(url: str, *, allow_private: bool,
                      resolver: Resolver | None = None) -> Target:
    """Everything POST /webhooks checks: the URL, and in production where it resolves to."""
    target = parse_url(url, allow_http=allow_private)
    if not allow_private:
        resolve_checked(target, allow_private=False, resolver=resolver)
    return target
