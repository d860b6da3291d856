"""``rdc serve`` settings for exported repositories: ``--repo``, ``--repo-ro``, ``[repos]``,
grants of repositories in the token file, and what each token may do with them."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import trio

from rdc.errors import Refusal, UsageError
from rdc.storage import LocalStore
from rdc_server.config import load
from rdc_server.repos import RepoRegistry, parse_repo

TOKENS = ("all-repos-token-0001\n"
          "reader-token-000002 bk:ro\n"
          "writer-token-000003 bk offsite\n")


def args(tmp: Path, **overrides) -> argparse.Namespace:
    (tmp / "tokens").write_text(TOKENS)
    base = dict(config=None, listen=None, share=None, share_ro=None, repo=None, repo_ro=None,
                token_file=str(tmp / "tokens"), state_dir=str(tmp / "state"), tls_cert=None,
                tls_key=None)
    return argparse.Namespace(**{**base, **overrides})


def test_repositories_alone_are_enough_to_serve(tmp_path: Path) -> None:
    config = load(args(tmp_path, repo=[f"bk={tmp_path / 'bk'}"],
                       repo_ro=["offsite=s3://127.0.0.1:9000/bucket/rdc"]))
    assert not config.shares
    assert config.repos["bk"].location == str(tmp_path / "bk") and not config.repos["bk"].readonly
    assert config.repos["offsite"].location == "s3://127.0.0.1:9000/bucket/rdc"
    assert config.repos["offsite"].readonly


def test_toml_repos_and_command_line_override(tmp_path: Path) -> None:
    (tmp_path / "rdc.toml").write_text(
        "[repos]\n"
        f'bk = "{tmp_path / "from-file"}"\n'
        'offsite = { location = "s3+https://s3.example/bk", readonly = true, colour = 1 }\n')
    config = load(args(tmp_path, config=str(tmp_path / "rdc.toml"),
                       repo=[f"bk={tmp_path / 'from-cli'}"]))
    assert config.repos["bk"].location == str(tmp_path / "from-cli")
    assert config.repos["offsite"].readonly
    assert any("'colour' in repository 'offsite'" in w for w in config.warnings)


def test_grants_name_repositories(tmp_path: Path) -> None:
    config = load(args(tmp_path, repo=[f"bk={tmp_path / 'bk'}"],
                       repo_ro=[f"offsite={tmp_path / 'off'}"]))
    everyone, reader, writer = (config.tokens.check(t) for t in (
        "all-repos-token-0001", "reader-token-000002", "writer-token-000003"))
    bk, offsite = config.repos["bk"], config.repos["offsite"]
    assert everyone.mode(bk) == "rw" and everyone.mode(offsite) == "ro"
    assert reader.mode(bk) == "ro" and reader.mode(offsite) is None
    assert writer.mode(bk) == "rw" and writer.mode(offsite) == "ro"  # the export's own mode


@pytest.mark.parametrize(("given", "message"), [
    ({"repo": ["bk"]}, "NAME=LOCATION"),
    ({"repo": ["a/b=/x"]}, "bad repository name"),
    ({"repo": ["bk=ftp://host/x"]}, "neither a directory nor an s3://"),
    ({"repo": ["bk=/x", "bk=/y"]}, "given twice"),
    ({"repo": ["bk=/x"], "share": ["bk=/"]}, "names both a share and a repository"),
    ({}, "no shares"),
])
def test_bad_repository_settings_are_one_line_errors(tmp_path: Path, given: dict,
                                                     message: str) -> None:
    with pytest.raises(UsageError, match=message):
        load(args(tmp_path, **given))


def test_a_file_is_not_a_repository_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="not a directory"):
        parse_repo(f"bk={tmp_path / 'file'}")


def test_the_registry_makes_the_directory_on_first_use_and_keeps_the_store(
    tmp_path: Path
) -> None:
    config = load(args(tmp_path, repo=[f"bk={tmp_path / 'new' / 'bk'}"],
                       repo_ro=[f"offsite={tmp_path / 'missing'}"]))
    registry = RepoRegistry(config.repos)
    assert not (tmp_path / "new").exists()  # nothing is made at start-up
    store = registry.store(config.repos["bk"])
    assert isinstance(store, LocalStore) and (tmp_path / "new" / "bk").is_dir()
    assert registry.store(config.repos["bk"]) is store
    with pytest.raises(Refusal, match="no such directory"):  # read-only: nothing made
        registry.store(config.repos["offsite"])
    assert not (tmp_path / "missing").exists()


def test_a_token_without_a_grant_is_told_the_same_as_for_no_such_name(tmp_path: Path) -> None:
    config = load(args(tmp_path, repo=[f"bk={tmp_path / 'bk'}",
                                       f"offsite={tmp_path / 'off'}"]))
    registry = RepoRegistry(config.repos)
    reader = registry.for_client(config.tokens.check("reader-token-000002"))

    async def refusal(name: str) -> str:
        with pytest.raises(Refusal) as info:
            await reader.open(name)
        assert info.value.code == "repo"
        return str(info.value).replace(repr(name), "NAME")

    async def main() -> None:
        assert await refusal("offsite") == await refusal("nowhere")
        opened = await reader.open("bk")
        assert opened.name == "bk" and not opened.writable

    trio.run(main)
