"""S3 store URLs and where the credentials come from (no server needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdc.storage import InvalidStoreUrl, StoreAccessDenied, StoreError
from rdc.storage.s3config import find_credentials, parse_s3_url


@pytest.mark.parametrize(
    ("url", "endpoint", "bucket", "prefix", "canonical"),
    [
        ("s3://127.0.0.1:8333/bkt", "http://127.0.0.1:8333", "bkt", "", None),
        ("s3://127.0.0.1:8333/bkt/", "http://127.0.0.1:8333", "bkt", "", "s3://127.0.0.1:8333/bkt"),
        ("s3://host/bkt/a/B-c/d.e", "http://host", "bkt", "a/B-c/d.e", None),
        ("s3+https://s3.example.com/my.bucket-1/backups/",
         "https://s3.example.com", "my.bucket-1", "backups",
         "s3+https://s3.example.com/my.bucket-1/backups"),
        ("s3://[::1]:9000/bkt/p", "http://[::1]:9000", "bkt", "p", None),
    ],
)
def test_urls_that_parse(
    url: str, endpoint: str, bucket: str, prefix: str, canonical: str | None
) -> None:
    where = parse_s3_url(url)
    assert (where.endpoint, where.bucket, where.prefix) == (endpoint, bucket, prefix)
    assert where.url == (canonical or url)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://host/bkt", "the scheme is s3://"),
        ("s3://host", "no bucket"),
        ("s3://host/", "no bucket"),
        ("s3:///bkt", "no host"),
        ("s3://key:secret@host/bkt", "credentials go in AWS_ACCESS_KEY_ID"),
        ("s3://host/bkt?region=x", "no query"),
        ("s3://host/bkt#x", "no query"),
        ("s3://host:99999/bkt", "Port out of range"),
        ("s3://host:port/bkt", "Port could not be cast"),
        ("s3://host/BKT", "not a bucket name"),
        ("s3://host/ab", "not a bucket name"),
        ("s3://host/a..b", "not a bucket name"),
        ("s3://host/bkt/a//b", "prefix part ''"),
        ("s3://host/bkt/../x", "prefix part '..'"),
        ("s3://host/bkt/a b", "prefix part 'a b'"),
    ],
)
def test_urls_that_do_not(url: str, message: str) -> None:
    with pytest.raises(InvalidStoreUrl) as caught:
        parse_s3_url(url)
    assert message in str(caught.value)
    assert str(caught.value).startswith(f"invalid store location {url!r}: ")
    assert caught.value.exit_code == 2


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_credentials_from_the_environment(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK",
           "AWS_SESSION_TOKEN": "TOK", "AWS_DEFAULT_REGION": "eu-west-1"}
    creds = find_credentials("s3://h/b", env)
    assert (creds.access_key_id, creds.secret_access_key, creds.session_token, creds.region,
            creds.source) == ("AK", "SK", "TOK", "eu-west-1", "the environment")
    assert "SK" not in repr(creds) and "TOK" not in repr(creds)
    env["AWS_REGION"] = "ap-south-1"  # the newer variable wins, as in the AWS SDKs
    assert find_credentials("s3://h/b", env).region == "ap-south-1"


def test_the_environment_wins_over_the_files(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "AWS_ACCESS_KEY_ID": "ENV", "AWS_SECRET_ACCESS_KEY": "ENVS",
           "AWS_SHARED_CREDENTIALS_FILE": write(
               tmp_path / "c", "[default]\naws_access_key_id = FILE\naws_secret_access_key = F\n")}
    assert find_credentials("s3://h/b", env).access_key_id == "ENV"


def test_half_the_keys_in_the_environment_is_an_error(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "AWS_ACCESS_KEY_ID": "AK"}
    with pytest.raises(StoreAccessDenied, match="AWS_SECRET_ACCESS_KEY is not set"):
        find_credentials("s3://h/b", env)


def test_credentials_from_a_profile_of_the_shared_file(tmp_path: Path) -> None:
    aws = tmp_path / ".aws"
    aws.mkdir()
    write(aws / "credentials", "[default]\naws_access_key_id = D\naws_secret_access_key = DS\n"
          "[backup]\naws_access_key_id = B\naws_secret_access_key = BS\n"
          "aws_session_token = BT\n")
    write(aws / "config", "[default]\nregion = us-west-2\n[profile backup]\nregion = eu-north-1\n")
    home = {"HOME": str(tmp_path)}
    creds = find_credentials("s3://h/b", home)
    assert (creds.access_key_id, creds.secret_access_key, creds.region) == ("D", "DS", "us-west-2")
    assert creds.source == f"profile 'default' of {aws / 'credentials'}"
    creds = find_credentials("s3://h/b", {**home, "AWS_PROFILE": "backup"})
    assert (creds.access_key_id, creds.session_token, creds.region) == ("B", "BT", "eu-north-1")


def test_files_named_by_the_environment_and_keys_in_the_config_file(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path / "nowhere"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "absent"),
           "AWS_CONFIG_FILE": write(tmp_path / "cfg", "[profile p]\naws_access_key_id = C\n"
                                    "aws_secret_access_key = CS\n"),
           "AWS_PROFILE": "p"}
    creds = find_credentials("s3://h/b", env)
    assert (creds.access_key_id, creds.region) == ("C", "us-east-1")
    assert creds.source == f"profile 'p' of {tmp_path / 'cfg'}"


def test_no_credentials_says_where_to_put_them(tmp_path: Path) -> None:
    with pytest.raises(StoreAccessDenied) as caught:
        find_credentials("s3://h/b", {"HOME": str(tmp_path), "AWS_PROFILE": "missing"})
    assert str(caught.value) == (
        "s3://h/b: access denied: no credentials: set AWS_ACCESS_KEY_ID and "
        f"AWS_SECRET_ACCESS_KEY, or give profile 'missing' keys in {tmp_path}/.aws/credentials"
    )


def test_an_unreadable_credentials_file_is_one_line(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path),
           "AWS_SHARED_CREDENTIALS_FILE": write(tmp_path / "bad", "no section header\n")}
    with pytest.raises(StoreError) as caught:
        find_credentials("s3://h/b", env)
    assert str(caught.value).startswith(f"s3://h/b: cannot read {tmp_path / 'bad'}: ")
    assert "\n" not in str(caught.value)
