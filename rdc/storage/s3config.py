"""Where an S3 store is and who we are there: the `s3://` URL and the AWS credentials.

`s3://HOST[:PORT]/BUCKET[/PREFIX]` speaks plain HTTP, `s3+https://...` HTTPS. Credentials
never go in the URL: they come from the environment (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) or else from a profile (AWS_PROFILE, default
`default`) of the shared credentials file (AWS_SHARED_CREDENTIALS_FILE, default
~/.aws/credentials) or of the config file (AWS_CONFIG_FILE, default ~/.aws/config); the
region from AWS_REGION, AWS_DEFAULT_REGION, the profile, or `us-east-1`. Nothing else is
consulted: in particular no instance-metadata service, which a custom endpoint never wants.
"""

from __future__ import annotations

import configparser
import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from rdc.storage.errors import InvalidStoreUrl, StoreAccessDenied, StoreError

SCHEMES = {"s3": "http", "s3+https": "https"}
# AWS's rules for new buckets (path-style addressing also admits older names; not needed).
BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
PREFIX_SEGMENT = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
DEFAULT_REGION = "us-east-1"


@dataclass(frozen=True)
class S3Location:
    """A parsed store URL. `url` is its canonical form, used in messages."""

    url: str
    endpoint: str
    bucket: str
    prefix: str


@dataclass(frozen=True)
class S3Credentials:
    """Keys and region, and where they were found (for messages, never the secret)."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)
    region: str = DEFAULT_REGION
    source: str = "the environment"


def parse_s3_url(url: str) -> S3Location:
    """The location named by an `s3://` or `s3+https://` URL, or InvalidStoreUrl."""

    def invalid(message: str) -> InvalidStoreUrl:
        return InvalidStoreUrl(url=url, message=message)

    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise invalid(str(exc)) from None
    scheme = SCHEMES.get(parts.scheme)
    if scheme is None:
        raise invalid("the scheme is s3:// (HTTP) or s3+https://")
    if parts.username is not None or parts.password is not None:
        raise invalid("credentials go in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise invalid("no query or fragment is allowed")
    host = parts.hostname
    if not host:
        raise invalid("no host: s3://HOST[:PORT]/BUCKET[/PREFIX]")
    if ":" in host:
        host = f"[{host}]"
    segments = parts.path.strip("/").split("/")
    bucket = segments[0]
    if not bucket:
        raise invalid("no bucket: s3://HOST[:PORT]/BUCKET[/PREFIX]")
    if not BUCKET.fullmatch(bucket) or ".." in bucket:
        raise invalid(f"{bucket!r} is not a bucket name (3-63 of a-z 0-9 . -)")
    prefix = segments[1:]
    for segment in prefix:
        if not PREFIX_SEGMENT.fullmatch(segment) or segment in (".", ".."):
            raise invalid(f"prefix part {segment!r}: use A-Z a-z 0-9 . _ - (no empty parts)")
    netloc = f"{host}:{port}" if port is not None else host
    canonical = f"{parts.scheme}://{netloc}/{'/'.join(segments)}"
    return S3Location(
        url=canonical, endpoint=f"{scheme}://{netloc}", bucket=bucket, prefix="/".join(prefix)
    )


def find_credentials(location: str, environ: Mapping[str, str] | None = None) -> S3Credentials:
    """The credentials to use, from the environment or the AWS files (module docstring);
    StoreAccessDenied if there are none, StoreError if a file cannot be read."""
    env = os.environ if environ is None else environ
    home = env.get("HOME") or os.path.expanduser("~")
    profile_name = env.get("AWS_PROFILE") or "default"
    credentials_file = env.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(
        home, ".aws", "credentials"
    )
    config_file = env.get("AWS_CONFIG_FILE") or os.path.join(home, ".aws", "config")
    from_credentials = _profile(location, credentials_file, profile_name)
    from_config = _profile(location, config_file, profile_name, config_style=True)
    profile = {**from_config, **from_credentials}
    region = (
        env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or profile.get("region")
        or DEFAULT_REGION
    )

    key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if key or secret:
        if not (key and secret):
            missing = "AWS_SECRET_ACCESS_KEY" if key else "AWS_ACCESS_KEY_ID"
            raise StoreAccessDenied(location=location, message=f"{missing} is not set")
        return S3Credentials(key, secret, env.get("AWS_SESSION_TOKEN") or None, region)

    key, secret = profile.get("aws_access_key_id"), profile.get("aws_secret_access_key")
    if key and secret:
        where = credentials_file if "aws_access_key_id" in from_credentials else config_file
        return S3Credentials(
            key, secret, profile.get("aws_session_token") or None, region,
            f"profile {profile_name!r} of {where}",
        )
    raise StoreAccessDenied(
        location=location,
        message="no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give "
        f"profile {profile_name!r} keys in {credentials_file}",
    )


def _profile(
    location: str, path: str, name: str, *, config_style: bool = False
) -> dict[str, str]:
    """The keys of profile `name` in an AWS INI file ({} if the file or profile is missing).
    The config file names a profile `[profile NAME]`, except `[default]`."""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f)
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, configparser.Error) as exc:
        reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
        raise StoreError(location=location, message=f"cannot read {path}: {reason}") from None
    section = f"profile {name}" if config_style and name != "default" else name
    if not parser.has_section(section):
        return {}
    return {k: v.strip() for k, v in parser.items(section)}
