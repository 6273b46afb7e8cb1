"""deploy/Dockerfile without a Docker engine: hadolint, plus the properties the deployment relies on.
(The HEALTHCHECK probe itself is run against a real daemon in test_daemon_deploy.py.)"""

from __future__ import annotations

import json
import re
import tomllib

from tests.deploy.tools import DEPLOY, ROOT, dockerfile_healthcheck_code, run_ok, tool

DOCKERFILE = DEPLOY / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_hadolint_clean() -> None:
    run_ok([tool("hadolint"), "--no-color", str(DOCKERFILE)])


def test_multi_stage_python_311_slim() -> None:
    ins = _instructions()
    froms = [a for i, a in ins if i == "FROM"]
    assert len(froms) >= 2, "expected a build stage and a runtime stage"
    base = next(a for i, a in ins if i == "ARG" and a.startswith("PYTHON_IMAGE="))
    assert re.fullmatch(r"PYTHON_IMAGE=python:3\.11-slim(-\w+)?", base)
    assert all(f.startswith("${PYTHON_IMAGE}") for f in froms)
    assert any(re.search(r"(--|,)from=build\b", a) for i, a in ins if i in ("COPY", "RUN")), (
        "runtime stage must take the build output"
    )


def test_runtime_contract() -> None:
    ins = _instructions()
    runtime = ins[max(k for k, (i, _) in enumerate(ins) if i == "FROM") :]
    get = lambda name: [a for i, a in runtime if i == name]  # noqa: E731
    user = get("USER")
    assert user and user[-1].split(":")[0] not in ("0", "root"), "must run as a non-root user"
    assert re.fullmatch(r"\d+:\d+", user[-1]), "numeric uid:gid (works with runAsNonRoot, no passwd lookup)"
    assert json.loads(get("VOLUME")[-1]) == ["/data"]
    assert get("EXPOSE") == ["7070"]
    assert get("STOPSIGNAL") == ["SIGTERM"]
    cmd = json.loads(get("CMD")[-1])
    assert cmd[:2] == ["delayd", "serve"]
    assert cmd[cmd.index("--data-dir") + 1] == "/data"
    assert cmd[cmd.index("--listen") + 1] == "0.0.0.0:7070"
    assert "--insecure" not in cmd, "the image default stays secure; compose adds --insecure explicitly"
    assert "--auto-token" in cmd, "without tokens the default command must still start, with a generated token"
    hc = get("HEALTHCHECK")
    assert len(hc) == 1 and 'CMD ["python", "-c"' in hc[0]
    code = dockerfile_healthcheck_code()
    assert "urllib.request" in code and "http://127.0.0.1:7070/healthz" in code


def test_build_inputs_exist_and_are_not_ignored() -> None:
    """Everything the Dockerfile COPYs from the context exists and is allowed by its ignore file."""
    ins = _instructions()
    sources = []
    for i, a in ins:
        if i == "COPY" and "--from=" not in a:
            sources += a.split()[:-1]
    assert sources, "no COPY from the build context"
    for s in sources:
        assert (ROOT / s).exists(), f"COPY source {s} is missing from the repository"
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    rules = [r.strip() for r in ignore if r.strip() and not r.startswith("#")]
    assert rules[0] == "*", "ignore file should be an allow-list"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    for s in sources:
        assert s.rstrip("/") in allowed, f"{s} is copied but excluded by Dockerfile.dockerignore"


def test_wheel_contents_match_packages() -> None:
    """The image installs the project wheel: every folder pyproject maps into the `delayd` package
    is copied into the build stage, and the image's `delayd` script is the package's entry point."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dir = project["tool"]["setuptools"]["package-dir"]
    packages = set(project["tool"]["setuptools"]["packages"])
    # Each package is a mapped folder or a folder inside one (delayd.broker.ui: broker/ui).
    assert set(package_dir) <= packages and all(p in package_dir or p.rpartition(".")[0] in package_dir for p in packages)
    assert {"delayd", "delayd.broker", "delayd.storage", "delayd.client"} <= set(package_dir)
    copied = {a.split()[0].rstrip("/") for i, a in _instructions() if i == "COPY" and "--from=" not in a}
    assert set(package_dir.values()) <= copied
    assert project["project"]["scripts"]["delayd"] == "delayd.cli:main", "the image runs the `delayd` script"


def test_build_stage_compiles_the_batch_core() -> None:
    """The wheel the image installs carries the compiled batch core: the build stage copies
    setup.py (which declares the extension) and installs a C compiler; the runtime stage has none."""
    ins = _instructions()
    last_from = max(k for k, (i, _) in enumerate(ins) if i == "FROM")
    build, runtime = ins[:last_from], ins[last_from:]
    copied = [a.split()[:-1] for i, a in build if i == "COPY" and "--from=" not in a]
    assert any("setup.py" in c for c in copied), "setup.py must reach the build stage"
    assert any(i == "RUN" and re.search(r"apt-get install .*\bgcc\b", a) for i, a in build)
    assert not any(i == "RUN" and "gcc" in a for i, a in runtime), "no compiler in the runtime image"
    setup = (ROOT / "setup.py").read_text()
    for c in sorted((ROOT / "storage").glob("*.c")):
        assert f"storage/{c.name}" in setup, f"{c.name} is not built by setup.py"
