"""``jetserve nats-config``: the users of a deployment (one per role, one per worker, ``tap``),
their files (a private folder, seeds only the owner reads unless for compose), the server's
``authorization`` block, and the compose file that gives each process its own key."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import yaml

from services.cli.__main__ import main
from services.cli.nats_config import parse_workers
from services.cli.secure import COMPOSE_NAME, CONF_NAME, SEED_IN_CONTAINER, new_user
from shared.bus_permissions import permissions
from shared.subjects import Subjects


def test_workers_are_service_equals_count() -> None:
    assert parse_workers(["mocker=2", "media=1"]) == {"mocker": 2, "media": 1}
    for bad in ("gateway=1", "mocker", "mocker=two"):
        with pytest.raises(ValueError, match="SERVICE=N"):
            parse_workers([bad])


def test_a_media_worker_is_bound_to_both_of_its_ids() -> None:
    user = new_user("media-0", "media")
    assert user.worker_ids == ("media-0-image", "media-0-video")
    assert new_user("router", "router").worker_ids == ()


def _generate(tmp_path: Path, *extra: str) -> Path:
    out = tmp_path / "auth"
    with pytest.raises(SystemExit) as done:
        main(["nats-config", "--out", str(out), "--namespace", "prod", *extra])
    assert done.value.code == 0
    return out


def test_writes_a_private_folder_of_seeds_and_the_servers_users(tmp_path: Path) -> None:
    out = _generate(tmp_path, "--workers", "mocker=2")
    names = sorted(p.stem for p in out.glob("*.nk"))
    assert names == [
        "formatter",
        "gateway",
        "mocker-0",
        "mocker-1",
        "preprocessor",
        "router",
        "tap",
    ]
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    assert stat.S_IMODE((out / "gateway.nk").stat().st_mode) == 0o600
    conf = (out / CONF_NAME).read_text()
    assert conf.count('"nkey": "U') == 7
    seeds = [(out / f"{name}.nk").read_text().strip() for name in names]
    assert not any(seed in conf for seed in seeds)  # public keys only reach the server's file
    mocker = permissions("mocker", Subjects("prod"), ("mocker-1",))
    assert all(subject in conf for subject in mocker.publish)


def test_the_compose_file_gives_each_process_its_key(tmp_path: Path) -> None:
    base = Path(__file__).resolve().parents[3] / "docker-compose.yml"
    out = _generate(tmp_path, "--compose", "--workers", "mocker=2", "--compose-file", str(base))
    compose = yaml.safe_load((out / COMPOSE_NAME).read_text())["services"]
    original = yaml.safe_load(base.read_text())["services"]
    assert stat.S_IMODE((out / "mocker-0.nk").stat().st_mode) == 0o644  # uid 10001 reads it
    assert compose["mocker"] == compose["embedder"] == {"scale": 0}  # no key: off
    worker = compose["mocker-1"]
    # A full copy of the base's mocker (compose 1.x cannot `extends` one with depends_on) ...
    assert worker["command"] == original["mocker"]["command"]
    assert worker["depends_on"] == original["mocker"]["depends_on"]
    # ... with its own id and key.
    assert worker["environment"]["JETSERVE_MOCKER_WORKER_ID"] == "mocker-1"
    assert worker["environment"]["JETSERVE_NATS_NKEY_SEED"] == SEED_IN_CONTAINER
    assert worker["volumes"] == [f"{out / 'mocker-1.nk'}:{SEED_IN_CONTAINER}:ro"]
    assert compose["router"]["volumes"] == [f"{out / 'router.nk'}:{SEED_IN_CONTAINER}:ro"]
    assert compose["nats"]["command"][-2:] == ["-c", "/etc/nats/jetserve-auth.conf"]
    assert "tap" not in compose


def test_a_worker_the_compose_file_lacks_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = tmp_path / "docker-compose.yml"
    base.write_text("services: {nats: {command: []}, mocker: {}}\n")
    out = tmp_path / "auth"
    argv = ["nats-config", "--out", str(out), "--compose", "--compose-file", str(base)]
    with pytest.raises(SystemExit) as done:
        main([*argv, "--workers", "hf_worker=1"])
    assert done.value.code == 2
    assert "has no service hf_worker" in capsys.readouterr().err
    assert not out.exists()
