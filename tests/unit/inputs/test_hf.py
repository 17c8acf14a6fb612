"""hf:// inputs: the URIs taken and refused, the key, and fetches through the real
``huggingface_hub`` client from a stand-in hub (tests/cluster/hub.py) serving repositories
these tests generate."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import hub as hub_server
from tests.unit.inputs.server import entry_files
from torchyard.inputs import cache, hf
from torchyard.inputs.fetch import fetch, main
from torchyard.inputs.uris import HubRepo, InputError, Source, cache_key, hub_repo_of, parse

LIMIT = 1 << 30


@pytest.mark.parametrize(
    ("uri", "repo"),
    [
        ("hf://acme/tiny", HubRepo("model", "acme/tiny", "main")),
        ("hf://gpt2", HubRepo("model", "gpt2", "main")),
        ("hf://acme/tiny@v1.0", HubRepo("model", "acme/tiny", "v1.0")),
        ("hf://acme/tiny@refs/pr/1", HubRepo("model", "acme/tiny", "refs/pr/1")),
        ("hf://datasets/acme/birds@" + "a" * 40, HubRepo("dataset", "acme/birds", "a" * 40)),
        ("hf://Acme-AI/tiny_model.v2", HubRepo("model", "Acme-AI/tiny_model.v2", "main")),
    ],
)
def test_an_hf_uri_names_a_repository_and_a_revision(uri: str, repo: HubRepo) -> None:
    assert hub_repo_of(uri) == repo
    assert parse(uri) == "hf"


@pytest.mark.parametrize(
    "uri",
    [
        "hf://",
        "hf:///etc/passwd",
        "hf://acme/../etc",
        "hf://../tiny",
        "hf://acme/..",
        "hf://acme/%2e%2e",
        "hf://acme%2F..%2Ftiny",
        "hf://acme/tiny/extra",
        "hf://acme//tiny",
        "hf://acme\\tiny",
        "hf://acme/ti--ny",
        "hf://acme/tiny.",
        "hf://.acme/tiny",
        "hf://acme/tiny@",
        "hf://acme/tiny@../main",
        "hf://acme/tiny@main/../../x",
        "hf://acme/tiny@%2e%2e/x",
        "hf://acme/tiny@refs//pr",
        "hf://acme/tiny@/abs",
        "hf://acme/tiny@refs/.hidden",
        "hf://acme/tiny@main.lock",
        "hf://acme/tiny@a@b",
        "hf://acme/tiny@main\x00",
        "hf://acme/tiny@ma in",
        "hf://user:token@acme/tiny",
        "hf://acme/" + "t" * 97,
    ],
)
def test_hf_uris_that_would_not_stay_a_name_on_the_hub_are_refused(uri: str) -> None:
    with pytest.raises(InputError):
        parse(uri)


def test_the_revision_as_written_the_secret_and_the_patterns_make_the_key() -> None:
    one = Source("hf://acme/tiny@main", secret="hub-a")
    assert cache_key(one) == cache_key(Source("hf://acme/tiny@main", secret="hub-a"))
    for other in (
        Source("hf://acme/tiny@v1", secret="hub-a"),
        Source("hf://acme/tiny@main", secret="hub-b"),
        Source("hf://acme/tiny@main", secret="hub-a", include=("*.json",)),
        Source("hf://datasets/acme/tiny@main", secret="hub-a"),
    ):
        assert cache_key(other) != cache_key(one)


# --- through huggingface_hub, from the stand-in hub ----------------------------------------

WEIGHTS = os.urandom(3 * hub_server.LFS_FROM)  # an LFS file: checked by its sha256
FILES = {
    "config.json": b'{"hidden": 8}',
    "weights/model.safetensors": WEIGHTS,
    "tokenizer/vocab.txt": b"a\nb\n",
}


@pytest.fixture
def hub() -> Iterator[hub_server.Hub]:
    running = hub_server.Hub()
    running.repo("acme/tiny").push(FILES)
    running.repo("acme/private", token="hf_right").push({"secret.txt": b"s"})
    running.repo("acme/birds", kind="datasets").push({"train/a.jpg": b"jpg", "README.md": b"r"})
    with hub_server.serving(running):
        yield running


def _env(hub: hub_server.Hub, token: str = "") -> dict[str, str]:
    return {"HF_ENDPOINT": hub.url, **({"HF_TOKEN": token} if token else {})}


def _files_asked(hub: hub_server.Hub) -> list[str]:
    return sorted(
        p.split("/resolve/", 1)[1].split("/", 1)[1]
        for m, p in hub.requests
        if m == "GET" and "/resolve/" in p
    )


def test_a_repository_is_fetched_at_its_commit_once_then_served_from_the_cache(
    hub: hub_server.Hub, tmp_path: Path
) -> None:
    source = Source("hf://acme/tiny")
    first = fetch(source, str(tmp_path), LIMIT, _env(hub))
    assert entry_files(str(tmp_path), source.key) == FILES
    assert first.entry.revision == hub.repos[("models", "acme/tiny")].refs["main"]
    assert first.fetched_bytes == sum(len(v) for v in FILES.values())
    assert not os.path.exists(os.path.join(cache.entry_dir(str(tmp_path), source.key), "hf"))
    sent = hub.sent
    second = fetch(source, str(tmp_path), LIMIT, _env(hub))
    assert (second.fetched_bytes, second.entry, hub.sent) == (0, first.entry, sent)


def test_patterns_become_the_clients_allow_list_and_only_those_files_are_asked_for(
    hub: hub_server.Hub, tmp_path: Path
) -> None:
    source = Source("hf://acme/tiny", include=("*.json", "*.txt"), exclude=("tokenizer/*",))
    fetch(source, str(tmp_path), LIMIT, _env(hub))
    assert entry_files(str(tmp_path), source.key) == {"config.json": FILES["config.json"]}
    assert _files_asked(hub) == ["config.json"]


def test_a_data_set_repository_is_read_from_the_datasets_kind(
    hub: hub_server.Hub, tmp_path: Path
) -> None:
    source = Source("hf://datasets/acme/birds", include=("train/*",))
    fetch(source, str(tmp_path), LIMIT, _env(hub))
    assert entry_files(str(tmp_path), source.key) == {"train/a.jpg": b"jpg"}


@pytest.mark.parametrize(
    ("uri", "include", "said"),
    [
        ("hf://acme/nothing", (), "the Hub has no model acme/nothing, or it is private"),
        ("hf://acme/birds", (), "the Hub has no model acme/birds"),  # a data set, asked as a model
        (
            "hf://acme/tiny@v9",
            (),
            "acme/tiny has no revision 'v9': check the branch, tag or commit",
        ),
        ("hf://acme/tiny@" + "0" * 40, (), "acme/tiny has no revision '" + "0" * 40),
        (
            "hf://acme/tiny",
            ("*.png",),
            r"hf://acme/tiny holds no file matching include \['\*.png'\]",
        ),
    ],
)
def test_a_bad_input_names_itself_and_leaves_nothing_in_the_cache(
    hub: hub_server.Hub, tmp_path: Path, uri: str, include: tuple[str, ...], said: str
) -> None:
    source = Source(uri, include=include)
    with pytest.raises(InputError, match=said) as err:
        fetch(source, str(tmp_path), LIMIT, _env(hub))
    assert str(err.value).startswith(uri)
    assert cache.read(str(tmp_path), source.key) is None
    assert not os.path.isdir(os.path.join(str(tmp_path), "entries")) or not os.listdir(
        os.path.join(str(tmp_path), "entries")
    )


def test_a_private_repository_needs_its_token_and_a_wrong_one_is_named(
    hub: hub_server.Hub, tmp_path: Path
) -> None:
    source = Source("hf://acme/private", secret="hub")
    with pytest.raises(InputError, match="private and the token"):
        fetch(source, str(tmp_path), LIMIT, _env(hub))
    with pytest.raises(InputError, match="it does not take the token: check HF_TOKEN"):
        fetch(source, str(tmp_path), LIMIT, _env(hub, "hf_wrong"))
    fetch(source, str(tmp_path), LIMIT, _env(hub, "hf_right"))
    assert entry_files(str(tmp_path), source.key) == {"secret.txt": b"s"}


def test_an_unreachable_hub_names_its_endpoint(tmp_path: Path) -> None:
    source = Source("hf://acme/tiny")
    with pytest.raises(InputError, match=r"cannot reach the Hub at http://127.0.0.1:9"):
        fetch(source, str(tmp_path), LIMIT, {"HF_ENDPOINT": "http://127.0.0.1:9"})


def test_a_moved_branch_is_fetched_again_at_its_new_commit(
    hub: hub_server.Hub, tmp_path: Path
) -> None:
    repo = hub.repos[("models", "acme/tiny")]
    source = Source("hf://acme/tiny@main", include=("config.json",))
    first = fetch(source, str(tmp_path), LIMIT, _env(hub))
    moved = repo.push({**FILES, "config.json": b'{"hidden": 16}'})
    second = fetch(source, str(tmp_path), LIMIT, _env(hub))
    assert (first.entry.revision != moved, second.entry.revision) == (True, moved)
    assert entry_files(str(tmp_path), source.key) == {"config.json": b'{"hidden": 16}'}
    pinned = Source(f"hf://acme/tiny@{first.entry.revision}", include=("config.json",))
    fetch(pinned, str(tmp_path), LIMIT, _env(hub))
    assert entry_files(str(tmp_path), pinned.key) == {"config.json": FILES["config.json"]}


def test_an_input_over_the_limit_is_refused_before_a_byte(
    hub: hub_server.Hub, tmp_path: Path
) -> None:
    with pytest.raises(InputError, match="over the inputs cache's limit"):
        fetch(Source("hf://acme/tiny"), str(tmp_path), len(WEIGHTS), _env(hub))
    assert hub.sent == 0


def test_a_killed_fetch_goes_on_without_fetching_finished_files_again(
    hub: hub_server.Hub, tmp_path: Path
) -> None:
    source = Source("hf://acme/tiny")
    hub.cut_after = len(WEIGHTS) // 2
    with pytest.raises(InputError):
        fetch(source, str(tmp_path), LIMIT, _env(hub))
    assert cache.read(str(tmp_path), source.key) is None
    hub.cut_after = None
    before = hub.sent
    done = fetch(source, str(tmp_path), LIMIT, _env(hub))
    assert entry_files(str(tmp_path), source.key) == FILES
    assert hub.sent - before < sum(len(v) for v in FILES.values())
    assert done.fetched_bytes == hub.sent - before


@pytest.mark.parametrize("path", ["../escape.txt", ".cache/huggingface/x", "a/../../b"])
def test_a_hub_that_lists_a_path_outside_the_folder_is_refused(
    hub: hub_server.Hub, tmp_path: Path, path: str
) -> None:
    hub.repo("acme/hostile").push({"ok.txt": b"ok", path: b"x"})
    source = Source("hf://acme/hostile")
    with pytest.raises(InputError, match="would not stay inside the input's folder"):
        fetch(source, str(tmp_path), LIMIT, _env(hub))
    assert cache.read(str(tmp_path), source.key) is None
    assert not (tmp_path.parent / "escape.txt").exists()


def test_the_fetch_jobs_entry_writes_the_commit_to_its_termination_log(
    hub: hub_server.Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    source = Source("hf://acme/tiny", include=("config.json",))
    log = tmp_path / "termination-log"
    argv = ["--cache", str(tmp_path / "cache"), "--uri", source.uri, "--key", source.key]
    assert main([*argv, "--include=config.json", "--max-bytes", str(LIMIT)], str(log)) == 0
    commit = hub.repos[("models", "acme/tiny")].refs["main"]
    assert f'"revision": "{commit}"' in log.read_text()
    assert hf.revision(source, _env(hub)) == commit
