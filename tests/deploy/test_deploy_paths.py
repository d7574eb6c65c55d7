"""Every host path the deployment kits name resolves, checked without a Docker engine.

For each compose file combination and each documented way of running compose, every service's
build context is the repository root, its Dockerfile and wheelhouse are there, and every bind
mount, env file and config exists or is made by a documented command (generate-certs.sh, the
wheelhouse). Relative paths are resolved both ways compose does it: docker-compose v1 (Python)
starts from the process's working directory, which the kernel keeps as the real folder (links
resolved); compose v2 (Go) keeps $PWD, the path as typed. Both must give the same folders. The
loopback kit's and the device check's paths are checked alongside.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from adaptfl.deploy import compose_check, layout, loopback
from tests.deploy.test_deploy_image import in_context

yaml = pytest.importorskip("yaml", reason="PyYAML is a test dependency: pip install -e '.[test]'")

ROOT = Path(__file__).resolve().parents[2]
COMBINATIONS = (("compose.yml",), ("compose.yml", "with-tls.yml"), ("compose.yml", "with-cuda.yml"),
                ("compose.yml", "with-tls.yml", "with-cuda.yml"))
FLAVOURS = ("v1", "v2")
NUM_NODES = 2  # the compose demo's SuperNodes (`./generate-certs.sh certs 2`)


@dataclass(frozen=True)
class Invocation:
    """Where compose runs (`cwd` as typed, i.e. $PWD) and what stands before each file after -f."""
    name: str
    cwd: Path
    prefix: str = ""

    def base(self, flavour: str) -> Path:
        """v1 reads os.getcwd(): the real folder; v2 reads $PWD, kept by `cd` through a link."""
        return Path(os.path.realpath(self.cwd)) if flavour == "v1" else Path(os.path.abspath(self.cwd))


INVOCATIONS = (
    Invocation("docs/deployment.md: cd deploy && $COMPOSE -f compose.yml", ROOT / "deploy"),
    # subprocess(cwd=DEPLOY): the kernel's working directory, so $PWD is its real path too
    Invocation("compose_check's cwd", Path(os.path.realpath(compose_check.DEPLOY))),
    Invocation("the repository root: $COMPOSE -f deploy/compose.yml", ROOT, "deploy/"),
)


def normalized(base: Path, relative: str) -> Path:
    """compose joins and cleans a relative path lexically (`..` drops the last name as written)."""
    return Path(os.path.normpath(os.path.join(base, os.path.expanduser(relative))))


def interpolate(value: str) -> str:
    """${VAR:-default} and ${VAR-default} as compose reads them with VAR unset (the documented
    defaults); a variable without a default would need a value the docs do not give."""
    def one(found: re.Match[str]) -> str:
        assert found.group(2) is not None, f"{found.group(0)} has no default: the docs name no value"
        return found.group(2)
    return re.sub(r"\$\{(\w+)(?::?-([^}]*))?\}", one, value)


def compose_files(invocation: Invocation, files: tuple[str, ...], flavour: str) -> list[Path]:
    return [normalized(invocation.base(flavour), invocation.prefix + name) for name in files]


def documented_certs(out: str, num_nodes: int) -> set[str]:
    """The paths generate-certs.sh makes under OUT_DIR, from its header (`#   OUT_DIR/...`);
    tests/deploy/test_deploy_loopback.py checks the header against a real run."""
    made: set[str] = set()
    for line in layout.GENERATE_CERTS.read_text().splitlines():
        found = re.match(r"#\s+OUT_DIR/(\S+)\s+(.*)", line)
        if not found:
            continue
        path, rest = found.groups()
        names = [""] if not path.endswith("/") else ["", *re.split(r"\s+\(", rest)[0].split()]
        for i in range(1, num_nodes + 1):
            for name in names:
                made.add(f"{out}/{path.replace('-N', f'-{i}')}{name.replace('-N', f'-{i}')}".rstrip("/"))
    return made


def made_by_documented_commands(deploy: Path) -> set[Path]:
    """Host paths the documented commands create, run in `deploy` (compose_check.PHASES, and the
    wheelhouse commands in the compose files' headers): wheelhouses and generate-certs.sh's tree."""
    commands = [c for phase in compose_check.PHASES.values() for c in phase]
    for name in ("compose.yml", "with-tls.yml", "with-cuda.yml"):
        lines = (deploy / name).read_text().splitlines()
        commands += [line.lstrip("# ") for line in lines  # the commands: `#   cmd`
                     if line.startswith("#   ") and re.search(r"deploy\.wheelhouse|generate-certs", line)]
    made: set[Path] = set()
    for command in commands:
        words = shlex.split(command.split("#")[0])
        if "adaptfl.deploy.wheelhouse" in words:
            out = words[words.index("adaptfl.deploy.wheelhouse") + 1]
            made |= {normalized(deploy, out), normalized(deploy, f"{out}/requirements.txt")}
        scripts = [w for w in words if w.endswith("generate-certs.sh")]
        if scripts:
            assert normalized(deploy, scripts[0]) == normalized(deploy, "generate-certs.sh"), command
            out, nodes = words[words.index(scripts[0]) + 1: words.index(scripts[0]) + 3]
            made |= {normalized(deploy, p) for p in documented_certs(out, int(nodes))}
    assert made, "no documented command makes a wheelhouse or certificates"
    return made


def merged_services(paths: list[Path]) -> tuple[dict, dict]:
    """(services, top level) of the files, each service's relative paths still as written; the
    overlays' volumes are added by target (compose's merge), other keys replaced."""
    services: dict[str, dict] = {}
    top: dict[str, dict] = {}
    for path in paths:
        data = yaml.safe_load(path.read_text())
        for key in ("volumes", "networks", "configs", "secrets"):
            top.setdefault(key, {}).update(data.get(key) or {})
        for name, service in data.get("services", {}).items():
            target = services.setdefault(name, {})
            for key, value in service.items():
                if key == "volumes":
                    target[key] = [*target.get(key, []), *value]
                elif key == "build" and isinstance(value, dict) and isinstance(target.get(key), dict):
                    target[key] = {**target[key], **value}
                else:
                    target[key] = value
    return services, top


def bind_sources(service: dict) -> list[str]:
    """Host paths of a service's bind mounts (short syntax `src:dst[:mode]` or long `type: bind`)."""
    sources = []
    for volume in service.get("volumes", []):
        source = volume.get("source", "") if isinstance(volume, dict) else interpolate(volume).split(":")[0]
        if isinstance(volume, dict) and volume.get("type") != "bind":
            continue
        if source.startswith((".", "/", "~")):
            sources.append(source)
    return sources


def dockerfile_wheelhouse(dockerfile: Path) -> str:
    found = re.search(r"^ARG WHEELHOUSE=(\S+)", dockerfile.read_text(), re.M)
    assert found, f"{dockerfile} declares no WHEELHOUSE"
    return found.group(1)


def resolve(invocation: Invocation, files: tuple[str, ...], flavour: str) -> dict[str, Path]:
    """Every host path the files name, resolved as compose `flavour` would (`what -> path`);
    asserts each exists or is made by a documented command."""
    paths = compose_files(invocation, files, flavour)
    for path in paths:
        assert path.is_file(), f"{invocation.name} ({flavour}): no {path}"
    project = paths[0].parent  # relative paths in every file are the first file's folder's
    made = {p.resolve() for p in made_by_documented_commands(project)}
    services, top = merged_services(paths)
    found: dict[str, Path] = {}

    def there(what: str, path: Path) -> None:
        assert path.exists() or path.resolve() in made, (
            f"{invocation.name} ({flavour}) {files}: {what} {path} does not exist and no documented "
            "command makes it")
        found[what] = path

    for name, service in services.items():
        build = service.get("build")
        if build is not None:
            build = {"context": build} if isinstance(build, str) else build
            context = normalized(project, interpolate(build["context"]))
            there(f"{name} build context", context)
            assert context.resolve() == ROOT.resolve(), (
                f"{invocation.name} ({flavour}) {files}: {name}'s build context is {context}, "
                f"not the repository root {ROOT}")
            dockerfile = normalized(context, build.get("dockerfile", "Dockerfile"))
            there(f"{name} Dockerfile", dockerfile)
            wheelhouse = (build.get("args") or {}).get("WHEELHOUSE") or dockerfile_wheelhouse(dockerfile)
            there(f"{name} wheelhouse", normalized(context, wheelhouse) / "requirements.txt")
            assert in_context(f"{wheelhouse}/requirements.txt"), f"{wheelhouse}: not in .dockerignore"
        for i, source in enumerate(bind_sources(service)):
            there(f"{name} bind mount {i}", normalized(project, source))
        env_files = service.get("env_file", [])
        for i, env_file in enumerate([env_files] if isinstance(env_files, str) else env_files):
            there(f"{name} env_file {i}", normalized(project, env_file))
    for kind in ("configs", "secrets"):
        for name, item in top.get(kind, {}).items():
            if "file" in (item or {}):
                there(f"{kind} {name}", normalized(project, item["file"]))
    return found


@pytest.mark.parametrize("invocation", INVOCATIONS, ids=lambda i: i.name)
@pytest.mark.parametrize("files", COMBINATIONS, ids="+".join)
def test_every_service_resolves_the_same_with_compose_v1_and_v2_to_the_repository(files, invocation) -> None:
    found = {flavour: resolve(invocation, files, flavour) for flavour in FLAVOURS}
    assert found["v1"].keys() == found["v2"].keys()
    for what, path in found["v1"].items():
        other = found["v2"][what]
        assert os.path.realpath(path) == os.path.realpath(other), (
            f"{invocation.name} {files}: {what} is {path} for compose v1, {other} for v2")
    contexts = [k for k in found["v1"] if k.endswith("build context")]
    assert contexts, "no service builds the project image"


def test_the_operator_sends_the_repository_and_reads_the_connections_file() -> None:
    """`flwr run /app/project` needs the checkout's pyproject.toml; its connections are operator.toml."""
    for invocation in INVOCATIONS:
        for flavour in FLAVOURS:
            project = compose_files(invocation, ("compose.yml",), flavour)[0].parent
            mounts = {v.split(":")[1]: normalized(project, v.split(":")[0])
                      for v in merged_services([project / "compose.yml"])[0]["operator"]["volumes"]}
            assert (mounts[compose_check.APP] / "pyproject.toml").is_file(), (invocation.name, flavour)
            assert mounts[compose_check.APP].resolve() == ROOT.resolve(), (invocation.name, flavour)
            assert mounts["/app/.flwr/config.toml"].is_file(), (invocation.name, flavour)


def test_the_containers_certificate_paths_are_in_the_folders_generate_certs_makes() -> None:
    """Each `/app/certificates/X` a TLS service or the operator's commands name is in the host
    folder mounted there, as generate-certs.sh lays it out."""
    made = documented_certs("certs", NUM_NODES)
    services, _ = merged_services([layout.DEPLOY / "compose.yml", layout.DEPLOY / "with-tls.yml"])
    operator_args = " ".join(c for c in compose_check.PHASES["tls"] if " operator " in c)
    checked = 0
    for name, service in services.items():
        mounts = {v.split(":")[1]: v.split(":")[0] for v in service.get("volumes", [])}
        if "/app/certificates" not in mounts:
            continue
        folder = os.path.normpath(mounts["/app/certificates"])
        args = " ".join(map(str, service.get("command", [])))
        args += f" {operator_args}" if name == "operator" else ""
        for file in re.findall(r"/app/certificates/(\S+)", args):
            assert f"{folder}/{file}" in made, f"{name}: /app/certificates/{file} is not in {folder}/"
            checked += 1
    assert checked >= 10


def test_the_compose_checks_own_paths_are_the_deploy_folders() -> None:
    """compose_check runs the phases in layout.DEPLOY and reads certificates from layout.CERTS,
    which `./generate-certs.sh certs N` in it makes; stand_in builds from the top's Dockerfile."""
    assert compose_check.DEPLOY == layout.DEPLOY and (layout.DEPLOY / "compose.yml").is_file()
    assert layout.CERTS / "ca.crt" in made_by_documented_commands(layout.DEPLOY)
    assert layout.WHEELHOUSE / "requirements.txt" in made_by_documented_commands(layout.DEPLOY)
    assert layout.STAND_IN_DOCKERFILE.is_file()
    stand_in_wheelhouse = dockerfile_wheelhouse(layout.STAND_IN_DOCKERFILE)
    assert normalized(layout.PROJECT, stand_in_wheelhouse) == layout.WHEELHOUSE
    for command in (c for phase in compose_check.PHASES.values() for c in phase):
        for script in re.findall(r"(?:^|\s)(\./\S+\.sh)", command):
            assert os.access(layout.DEPLOY / script, os.X_OK), f"{script} is not an executable in deploy/"
        for module in re.findall(r"python -m (\S+)", command):
            assert importlib.util.find_spec(module) is not None, module


def test_the_loopback_kit_reads_generate_certs_and_sends_the_checkout() -> None:
    assert loopback.GENERATE_CERTS == layout.GENERATE_CERTS and layout.GENERATE_CERTS.is_file()
    assert (loopback.PROJECT / "pyproject.toml").is_file()  # `flwr run` sends the checkout
    assert loopback.PROJECT.resolve() == ROOT.resolve()


def _prepare_device_bundle() -> ModuleType:
    spec = importlib.util.spec_from_file_location("prepare_device_bundle",
                                                  ROOT / "scripts" / "prepare_device_bundle.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_device_check_finds_every_file_it_names_and_what_the_bundle_makes() -> None:
    """scripts/device_check.sh: each repository path and `python3 -m` module it runs exists; it
    reads the bundle's outputs where scripts/prepare_device_bundle.py writes them; the bundle's
    certificates come from deploy/generate-certs.sh."""
    script = (ROOT / "scripts" / "device_check.sh").read_text()
    named = set(re.findall(r"\b((?:tests|benchmarks|scripts|deploy|adaptfl|examples)/[\w./-]+\.(?:py|sh))",
                           script))
    assert len(named) >= 5, named
    for path in named:
        assert (ROOT / path).is_file(), f"scripts/device_check.sh names {path}, which is not there"
    for module in re.findall(r"python3? -m (adaptfl[\w.]*)", script):
        assert importlib.util.find_spec(module) is not None, module
    bundle = _prepare_device_bundle()
    assert bundle.GENERATE_CERTS.is_file()
    for output in (bundle.WHEELS, bundle.DATA, bundle.CERTS):
        assert str(output.relative_to(ROOT)) in script, f"device_check.sh never reads {output}"
