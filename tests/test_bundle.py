"""``heldout bundle``: the one archive a reviewer needs (records, ledgers, manifests, report,
environment, public keys), with nothing secret in it, checked by a reviewer on another home.

The adversary: a run dir someone prepared so that bundling it ships a secret, e.g. a ledger that
is a link to the writer's signing key, or a report folder holding a link to the ledger key."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from heldout.data_manifests import MANIFEST_PATH_ENV, Manifest
from heldout.evaluators.ledger import LEDGER_FILE
from heldout.evaluators.records import RECORD_FILE
from heldout.evaluators.signing import parse_private_key
from warm_cli import WarmCli

REPO = Path(__file__).resolve().parents[1]
KEY_ENV = ("HELDOUT_LEDGER_KEY", "HELDOUT_SIGNING_KEY_FILE", "HELDOUT_SIGNING_KEY")


def home(root: Path, name: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in KEY_ENV}
    env.update(HOME=str(root / name), XDG_CONFIG_HOME=str(root / name / ".config"))
    (root / name).mkdir(parents=True, exist_ok=True)
    return env


def heldout(warm: WarmCli, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """The real command in a process of its own with ``env`` (its machine's home), forked from the
    session's warm server: heldout reads homes, keys and the manifest path when it runs."""
    return warm.run(*args, cwd=REPO, env=env)


@pytest.fixture(scope="module")
def study(warm_cli, tmp_path_factory):
    root = tmp_path_factory.mktemp("bundle")
    writer = home(root, "writer")
    made = heldout(warm_cli, writer, "run", "--task", "heilbronn/triangle11", "--optimizer", "seed", "--seeds", "0,1",
                   "--budget", "3", "--run-dir", str(root / "study"))
    assert made.returncode == 0, made.stderr
    report = root / "report"
    report.mkdir()
    (report / "results.json").write_text(json.dumps({"note": "the report the authors published"}))
    config = Path(writer["XDG_CONFIG_HOME"]) / "heldout"
    return {"root": root, "writer": writer, "study": root / "study", "report": report,
            "signing_key": config / "signing.key", "ledger_key": config / "ledger.key"}


def secrets_of(study) -> dict[str, bytes]:
    """Every form a writer's secret could take in a file."""
    pem = study["signing_key"].read_bytes()
    raw = parse_private_key(pem.decode(), "test")._private.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    hmac_hex = study["ledger_key"].read_text().strip()
    return {"signing key PEM": pem.strip(), "signing key raw": raw, "signing key base64": base64.b64encode(raw),
            "signing key PEM body": pem.splitlines()[1], "HMAC key hex": hmac_hex.encode(),
            "HMAC key raw": bytes.fromhex(hmac_hex)}


def members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_the_bundle_holds_what_a_reviewer_needs_and_no_secret(study, warm_cli):
    out = study["root"] / "review.tar.gz"
    done = heldout(warm_cli, study["writer"], "bundle", str(study["study"]), "--report", str(study["report"]),
                   "--out", str(out))
    assert done.returncode == 0, done.stderr
    files = members(out)
    names = {name.removeprefix("heldout-bundle/") for name in files}
    runs = [f"runs/study/heilbronn__triangle11/seed/seed-{s}" for s in (0, 1)]
    assert {f"{run}/{name}" for run in runs for name in ("ledger.jsonl", "ledger.head", "run_record.json")} <= names
    assert {"bundle.json", "SIGNERS", "environment.json", "manifests/heilbronn/triangle11.json",
            "report/results.json", "runs/study/study.json", "runs/study/study.toml"} <= names
    assert not any(name.endswith(".lock") for name in names)
    index = json.loads(files["heldout-bundle/bundle.json"])
    assert index["manifests"][0]["matches_records"] is True
    for name, meta in index["files"].items():  # every file listed with its digest
        assert len(files[f"heldout-bundle/{name}"]) == meta["bytes"]
    everything = b"".join(files.values()) + "".join(files).encode()
    for what, secret in secrets_of(study).items():
        assert secret not in everything, f"the bundle holds the {what}"


def test_a_reviewer_with_the_published_key_verifies_the_unpacked_bundle(study, warm_cli, tmp_path):
    out = tmp_path / "review.tar.gz"
    assert heldout(warm_cli, study["writer"], "bundle", str(study["study"]), "--out", str(out)).returncode == 0
    with tarfile.open(out) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    published = heldout(warm_cli, study["writer"], "key", "show", "--name", "authors").stdout
    (tmp_path / "allowed_signers").write_text(published)
    bundled = (tmp_path / "unpacked" / "heldout-bundle" / "SIGNERS").read_text()
    assert published.split()[1] in bundled  # the bundle names the key, for comparison only
    reviewer = home(tmp_path, "reviewer")
    done = heldout(warm_cli, reviewer, "ledger", "verify", str(tmp_path / "unpacked" / "heldout-bundle" / "runs"),
                   "--trusted-signers", str(tmp_path / "allowed_signers"))
    assert done.returncode == 0 and done.stdout.count("signed by authors") == 2, done.stdout
    # without the published key, the keys the bundle carries vouch for nothing
    assert heldout(warm_cli, reviewer, "ledger", "verify",
                   str(tmp_path / "unpacked" / "heldout-bundle" / "runs")).returncode == 4


@pytest.mark.parametrize("plant", ["a ledger linking to the signing key", "a report linking to the ledger key"])
def test_a_planted_link_to_a_secret_is_refused_in_one_line_and_nothing_is_written(study, warm_cli, tmp_path, plant):
    copy = tmp_path / "study"
    shutil.copytree(study["study"], copy, symlinks=True, ignore=shutil.ignore_patterns("*.lock"))
    report = tmp_path / "report"
    shutil.copytree(study["report"], report)
    if plant.startswith("a ledger"):
        ledger = next(copy.rglob(RECORD_FILE)).parent / LEDGER_FILE
        ledger.unlink()
        ledger.symlink_to(study["signing_key"])
    else:
        (report / "key.txt").symlink_to(study["ledger_key"])
    out = tmp_path / "review.tar.gz"
    done = heldout(warm_cli, study["writer"], "bundle", str(copy), "--report", str(report), "--out", str(out))
    assert done.returncode == 2 and "symbolic link" in done.stderr and len(done.stderr.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report", "study"]  # no archive, no temp file


def test_the_bundle_carries_the_manifest_the_runs_used_when_a_user_manifest_comes_first(study, warm_cli, tmp_path):
    # a user manifest that adds a profile sits first on the search path; the runs used the shipped
    # one, so that is the manifest a reviewer must get (the first found did not match the records)
    shipped = Manifest.load("heilbronn/triangle11")
    root = tmp_path / "manifests"
    replace(shipped, profiles={"mine": shipped.profiles["default"]}, notes={}, profile_digests={}).save(root)
    writer = {**study["writer"], MANIFEST_PATH_ENV: str(root)}
    out = tmp_path / "review.tar.gz"
    done = heldout(warm_cli, writer, "bundle", str(study["study"]), "--out", str(out))
    assert done.returncode == 0, done.stderr
    files = members(out)
    index = json.loads(files["heldout-bundle/bundle.json"])
    assert index["manifests"][0]["matches_records"] is True
    carried = json.loads(files["heldout-bundle/manifests/heilbronn/triangle11.json"])
    assert "mine" not in carried["profiles"]
