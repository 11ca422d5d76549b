"""Signatures a second machine can check: studies made under separate homes (each its own config
dir, ledger key and, unless a CI secret names one, signing key), checked by a reviewer whose home
holds no secret of theirs, with the public key alone, through the real CLI.

The adversary: someone who copies a study, edits a number (in the run record, or in a ledger entry
with the chain rehashed after it) and signs the result with a key of their own; someone who strips
the signatures; a CI job with no key at all. Each must fail with its own message and exit code,
and the gate must never pass them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from heldout.evaluators.ledger import HEAD_FILE, HEAD_PURPOSE, LEDGER_FILE, entry_hash, head_payload
from heldout.evaluators.records import RECORD_FILE, RunRecord
from heldout.evaluators.signing import SigningKey, parse_private_key
from warm_cli import WarmCli

REPO = Path(__file__).resolve().parents[1]
TASK = "heilbronn/triangle11"  # one held-out instance: the seed candidate is ~80% worse on every seed
SEEDS = "0,1,2,3,4"  # an exact sign-flip over 5 seeds can reach p = 1/32 < 0.05
STUDY_ENV = ("HELDOUT_LEDGER_KEY", "HELDOUT_SIGNING_KEY_FILE", "HELDOUT_SIGNING_KEY")


def home(root: Path, name: str, secret: str | None = None) -> dict[str, str]:
    """The environment of one machine: its own HOME and config dir, no key given by the tests."""
    env = {k: v for k, v in os.environ.items() if k not in STUDY_ENV}
    env.update(HOME=str(root / name), XDG_CONFIG_HOME=str(root / name / ".config"))
    if secret is not None:
        env["HELDOUT_SIGNING_KEY"] = secret
    (root / name).mkdir(parents=True, exist_ok=True)
    return env


@pytest.fixture(scope="module")
def cli() -> WarmCli:
    """The real command, each call a process of its own with the environment of the machine it
    plays (forked from one that imported heldout once: heldout reads homes and keys when it runs)."""
    warm = WarmCli()
    yield warm
    warm.close()


def heldout(cli: WarmCli, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return cli.run(*args, cwd=REPO, env=env)


def run_dirs(study: Path) -> list[Path]:
    return sorted(p.parent for p in study.rglob(RECORD_FILE))


@pytest.fixture(scope="module")
def world(cli, tmp_path_factory):
    """A CI secret key; a baseline made on runner A and, on runner B, an identical rerun and a planted
    regression, all signed with the secret; a PR study B signed with B's own key; a reviewer home."""
    root = tmp_path_factory.mktemp("machines")
    secret_file = root / "ci-key.pem"
    made = heldout(cli, home(root, "maintainer"), "key", "generate", str(secret_file), "--name", "ci")
    assert made.returncode == 0, made.stderr
    signers_line = made.stdout.strip()
    secret = secret_file.read_text()
    studies = {"baseline": ("runner-a", secret, "geometry-search", SEEDS),
               "rerun": ("runner-b", secret, "geometry-search", SEEDS),
               "regression": ("runner-b", secret, "seed", SEEDS),
               "own-key": ("laptop", None, "seed", "0,1")}  # refused before any pairing: two runs show it
    # one after another through the warm command (a process each, its machine's environment), not
    # four interpreters started at once: the same runs without four starts and imports (issue 59)
    for name, (machine, key, optimizer, seeds) in studies.items():
        done = heldout(cli, home(root, machine, key), "run", "--task", TASK, "--optimizer", optimizer, "--seeds", seeds,
                       "--budget", "30", "--jobs", "1", "--run-dir", str(root / name))
        assert done.returncode == 0, f"{name}: {done.stderr[-2000:]}"
    (root / "allowed_signers").write_text(f"# the CI runner's key\n{signers_line}\n")
    public_key = signers_line.split()[1]
    return {"root": root, "public_key": public_key, "signers": root / "allowed_signers",
            "reviewer": home(root, "reviewer"), "secret": secret}


def test_the_gate_passes_an_identical_rerun_from_another_runner_with_the_public_key_only(cli, world):
    root, reviewer = world["root"], world["reviewer"]
    done = heldout(cli, reviewer, "check", "--baseline", str(root / "baseline"), "--current", str(root / "rerun"),
                   "--trust-key", f"ci={world['public_key']}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("PASS") and "identical" in done.stdout
    assert "runs signed by baseline: ci, current: ci" in done.stdout
    assert not (Path(reviewer["XDG_CONFIG_HOME"]) / "heldout").exists()  # the reviewer holds no secret, none made
    # the two runners anchored their heads under different ledger keys: that is not tampering
    heads = [json.loads((d / HEAD_FILE).read_text())["key_id"] for d in (run_dirs(root / "baseline")[0],
                                                                         run_dirs(root / "rerun")[0])]
    assert heads[0] != heads[1]


def test_the_gate_fails_a_planted_regression_checked_with_the_committed_signers_file(cli, world):
    root = world["root"]
    done = heldout(cli, world["reviewer"], "check", "--baseline", str(root / "baseline"), "--current",
                   str(root / "regression"), "--trusted-signers", str(world["signers"]))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("REGRESSION")


def test_the_reviewer_verifies_authenticity_and_names_the_signer(cli, world):
    done = heldout(cli, world["reviewer"], "ledger", "verify", str(world["root"] / "baseline"),
                   "--trusted-signers", str(world["signers"]))
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    assert len(lines) == 6 and all(line.startswith("ok ") and "signed by ci (SHA256:" in line for line in lines[:5])
    assert lines[5] == "5 run(s) checked: 5 authentic"


def test_a_study_signed_by_a_key_not_trusted_fails_naming_its_fingerprint(cli, world):
    root, reviewer = world["root"], world["reviewer"]
    laptop = load_key_of(root / "laptop")
    done = heldout(cli, reviewer, "ledger", "verify", str(root / "own-key"), "--trusted-signers", str(world["signers"]))
    assert done.returncode == 4
    assert all(line.startswith("UNTRUSTED") and laptop.fingerprint in line for line in done.stdout.splitlines()[:2])
    gate = heldout(cli, reviewer, "check", "--baseline", str(root / "baseline"), "--current", str(root / "own-key"),
                   "--trusted-signers", str(world["signers"]))
    assert gate.returncode == 2 and gate.stdout == ""
    err = gate.stderr.splitlines()
    assert err[0].startswith("heldout: error: cannot gate runs that are not authentic") and len(err) == 3
    assert all(line.startswith("  current run UNTRUSTED SIGNER") and laptop.fingerprint in line
               and len(line) - len(str(root)) < 250 for line in err[1:])


def test_no_trusted_signer_and_no_key_never_passes(cli, world):
    root = world["root"]
    done = heldout(cli, world["reviewer"], "check", "--baseline", str(root / "baseline"), "--current",
                   str(root / "rerun"))
    assert done.returncode == 2
    assert "no trusted signer was given and this machine has no signing key" in done.stderr.splitlines()[0]


def test_a_copied_study_with_one_record_number_edited_and_re_signed_is_tampered(cli, world, tmp_path):
    copy = copy_study(world, tmp_path)
    run_dir = run_dirs(copy)[2]
    record = RunRecord.load(run_dir)
    record.test_score = 0.01  # the forger's number ...
    record.sign(forger())  # ... signed with the forger's key
    record.save(run_dir)
    done = heldout(cli, world["reviewer"], "ledger", "verify", str(copy), "--trusted-signers", str(world["signers"]))
    assert done.returncode == 1
    line = next(line for line in done.stdout.splitlines() if str(run_dir) in line)
    assert line.startswith("INVALID") and "was edited after the session wrote it" in line
    gate = heldout(cli, world["reviewer"], "check", "--baseline", str(copy), "--current", str(world["root"] / "rerun"),
                   "--trusted-signers", str(world["signers"]))
    # the gate collects no run whose record disagrees with its ledger: one line names it and why
    err = gate.stderr.splitlines()
    assert gate.returncode == 2 and len(err) == 1 and f": baseline run EXCLUDED {run_dir}: run_record.json was edited" in err[0]
    assert len(err[0].partition(str(run_dir))[2]) < 250


def test_a_copied_study_with_one_ledger_entry_edited_rehashed_and_re_signed_is_untrusted(cli, world, tmp_path):
    """The full forgery: a score raised in the ledger, the chain rehashed after it, session_end and
    the record made to match, head and record signed anew. Consistent, so only the key gives it away."""
    copy = copy_study(world, tmp_path)
    run_dir = run_dirs(copy)[0]
    key = forger()
    forge_score(run_dir, key)
    done = heldout(cli, world["reviewer"], "ledger", "verify", str(copy), "--trusted-signers", str(world["signers"]))
    assert done.returncode == 4
    line = next(line for line in done.stdout.splitlines() if str(run_dir) in line)
    assert line.startswith("UNTRUSTED") and key.fingerprint in line and "not among the trusted signers" in line
    # the forger's own key would call it authentic: the forgery is consistent, the key is the only defence
    assert heldout(cli, world["reviewer"], "ledger", "verify", str(run_dir), "--trust-key",
                   key.public_key).returncode == 0
    gate = heldout(cli, world["reviewer"], "check", "--baseline", str(world["root"] / "baseline"), "--current",
                   str(copy), "--trusted-signers", str(world["signers"]))
    assert gate.returncode == 2 and f"current run UNTRUSTED SIGNER {run_dir}" in gate.stderr


def test_a_forged_entry_keeping_the_old_signatures_is_tampered(cli, world, tmp_path):
    copy = copy_study(world, tmp_path)
    run_dir = run_dirs(copy)[1]
    forge_score(run_dir, key=None)
    done = heldout(cli, world["reviewer"], "ledger", "verify", str(run_dir), "--trusted-signers", str(world["signers"]))
    assert done.returncode == 1 and "does not match the content (edited after it was signed)" in done.stdout


def test_a_study_stripped_of_its_signatures_is_unsigned_and_the_gate_refuses_it(cli, world, tmp_path):
    copy = copy_study(world, tmp_path)
    for run_dir in run_dirs(copy):
        strip_signatures(run_dir)
    done = heldout(cli, world["reviewer"], "ledger", "verify", str(copy), "--trusted-signers", str(world["signers"]))
    assert done.returncode == 3 and done.stdout.startswith("UNANCHORED") and "unsigned" in done.stdout
    gate = heldout(cli, world["reviewer"], "check", "--baseline", str(world["root"] / "baseline"), "--current",
                   str(copy), "--trusted-signers", str(world["signers"]))
    assert gate.returncode == 2 and "current run UNSIGNED" in gate.stderr


def test_an_hmac_era_study_verifies_where_it_was_written_is_unanchored_elsewhere_and_migrates(cli, world, tmp_path):
    copy = copy_study(world, tmp_path)  # written on runner-a: its ledger key anchors the heads
    for k, run_dir in enumerate(run_dirs(copy)):
        strip_signatures(run_dir, key_id=k % 2 == 0)  # heads that name their HMAC key, and older ones
    runner_a = home(world["root"], "runner-a")
    here = heldout(cli, runner_a, "ledger", "verify", str(copy))
    assert here.returncode == 0 and "anchored by this machine's ledger key (HMAC" in here.stdout
    # another machine with a ledger key of its own: not INVALID, since nothing shows tampering
    other = home(tmp_path, "other")
    key_file = Path(other["XDG_CONFIG_HOME"]) / "heldout" / "ledger.key"
    key_file.parent.mkdir(parents=True)
    key_file.write_text(os.urandom(32).hex())
    there = heldout(cli, other, "ledger", "verify", str(copy), "--trusted-signers", str(world["signers"]))
    lines = there.stdout.splitlines()
    assert there.returncode == 3 and all(line.startswith("UNANCHORED") for line in lines[:5]), there.stdout
    assert sum("its HMAC anchor is another machine's ledger key" in line for line in lines) == 3
    assert sum("another machine's key or a rewritten head" in line for line in lines) == 2
    # migration: the writer signs what its ledger key vouches for; then anyone with the public key verifies
    signed = heldout(cli, {**runner_a, "HELDOUT_SIGNING_KEY": world["secret"]}, "ledger", "sign", str(copy))
    assert signed.returncode == 0 and signed.stdout.count("signed    ") == 5
    after = heldout(cli, other, "ledger", "verify", str(copy), "--trusted-signers", str(world["signers"]))
    assert after.returncode == 0, after.stdout
    # ... and a run edited before migration is refused, not laundered
    forge_score(run_dirs(copy)[0], key=None)
    assert heldout(cli, runner_a, "ledger", "sign", str(run_dirs(copy)[0])).returncode == 1


@pytest.mark.parametrize("bad", ["a signers file that is a folder", "a signers line of one word",
                                 "a signers file naming nobody", "a key that is not one"])
def test_a_bad_trust_list_is_one_line_and_exit_2_before_any_run_is_read(cli, world, tmp_path, bad):
    signers = tmp_path / "allowed_signers"
    flags = ["--trusted-signers", str(signers)]
    if bad == "a signers file that is a folder":
        signers.mkdir()
    elif bad == "a signers line of one word":
        signers.write_text(f"ci {world['public_key']}\nlonely\n")
    elif bad == "a signers file naming nobody":
        signers.write_text("# nobody yet\n")
    else:
        flags = ["--trust-key", "ci=ed25519:not-base64!"]
    for command in (["ledger", "verify", str(world["root"] / "baseline")],
                    ["check", "--baseline", str(world["root"] / "baseline"), "--current", str(world["root"] / "rerun")]):
        done = heldout(cli, world["reviewer"], *command, *flags)
        assert done.returncode == 2 and done.stdout == "", (bad, done.stdout)
        assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("heldout: error:"), done.stderr


# -- helpers ---------------------------------------------------------------------------------------
def forger() -> SigningKey:
    return SigningKey(Ed25519PrivateKey.generate(), "the forger's")


def load_key_of(machine_home: Path) -> SigningKey:
    pem = (machine_home / ".config" / "heldout" / "signing.key").read_text()
    return parse_private_key(pem, "test")


def copy_study(world, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(world["root"] / "baseline", copy, ignore=shutil.ignore_patterns("*.lock"))
    return copy


def strip_signatures(run_dir: Path, *, key_id: bool = True) -> None:
    """Make a run look written before signatures (and, without ``key_id``, before heads named their key)."""
    for name in (HEAD_FILE, RECORD_FILE):
        data = json.loads((run_dir / name).read_text())
        data.pop("signature", None)
        if not key_id:
            data.pop("key_id", None)
        (run_dir / name).write_text(json.dumps(data))


def forge_score(run_dir: Path, key: SigningKey | None) -> None:
    """Raise the held-out score in the ledger, rehash every entry after it, make session_end and
    the record match, and (with ``key``) sign head and record anew; without, the old signatures stay."""
    entries = [json.loads(line) for line in (run_dir / LEDGER_FILE).read_text().splitlines()]
    at = next(i for i, e in enumerate(entries) if e["kind"] == "test_scoring")
    entries[at]["data"]["verdict"]["score"] = 0.5
    record = RunRecord.load(run_dir)
    record.test_verdicts[0]["score"] = 0.5
    record.test_score = 0.5
    for i in range(at, len(entries)):
        entries[i]["prev"] = entries[i - 1]["hash"]
        if entries[i]["kind"] == "session_end":
            entries[i]["data"]["record_sha256"] = record.digest()
        entries[i]["hash"] = entry_hash(entries[i])
    (run_dir / LEDGER_FILE).write_text("".join(json.dumps(e) + "\n" for e in entries))
    record.ledger_head = entries[-1]["hash"]
    head = json.loads((run_dir / HEAD_FILE).read_text())
    head.update(count=len(entries), hash=entries[-1]["hash"])
    if key is not None:
        head["signature"] = key.sign(HEAD_PURPOSE, head_payload(entries[0]["hash"], len(entries), entries[-1]["hash"]))
        record.sign(key)
    (run_dir / HEAD_FILE).write_text(json.dumps(head))
    record.save(run_dir)


# -- the documented CI workflow ---------------------------------------------------------------------
def test_the_documented_workflow_installs_the_sandbox_signs_with_the_secret_and_gates_on_committed_keys():
    """docs/ci-regression-gate.md's workflow, read as GitHub would read it: every heldout command in it
    parses under this heldout; bubblewrap is installed before the study; the study and its key check
    get the secret; the gate trusts the committed signers file."""
    import re
    import shlex

    import yaml

    from heldout.cli.commands import build_parser

    doc = (REPO / "docs" / "ci-regression-gate.md").read_text()
    workflow = yaml.safe_load(re.search(r"```yaml\n(.*?)```", doc, re.S).group(1))
    steps = workflow["jobs"]["study"]["steps"]
    names = [s.get("name", s.get("run", s.get("uses", ""))) for s in steps]
    script = {name: step.get("run", "") for name, step in zip(names, steps)}
    at = {what: next(i for i, name in enumerate(names) if what in script[name] or what in name)
          for what in ("apt-get install -y bubblewrap", "heldout run", "heldout check", "heldout key show")}
    assert at["apt-get install -y bubblewrap"] < at["heldout run"]
    for what in ("heldout run", "heldout key show"):
        assert steps[at[what]]["env"]["HELDOUT_SIGNING_KEY"] == "${{ secrets.HELDOUT_SIGNING_KEY }}"
    commands = [shlex.split(line.replace("\\\n", " ").strip().split("||")[0])
                for text in script.values() for line in re.split(r"(?<!\\)\n", text) if line.strip().startswith("heldout ")]
    assert len(commands) >= 5
    for argv in commands:
        args = build_parser().parse_args(argv[1:])  # a flag this heldout does not know fails here
        if argv[1] == "check":
            assert args.trusted_signers == [".heldout/allowed_signers"]
