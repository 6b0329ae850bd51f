"""The build script, the compose files and the docs name the same images and tags (no Docker).

``scripts/docker-images.sh`` decides which images exist and how each architecture is tagged:
the plain tag on the host's own architecture, ``TAG-ARCH`` on every architecture (the only tag
a foreign one gets). ``docker/compose*.yml``, the Dockerfiles and ``docs/deployment.md`` must
name only those, at the lock file's Flower version, and the docs' "Architectures and tags"
table must list every one of them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "docker-images.sh"
DOCS = ROOT / "docs" / "deployment.md"
COMPOSE_FILES = sorted((ROOT / "docker").glob("compose*.yml"))
DOCKERFILES = [ROOT / "docker" / "Dockerfile", ROOT / "docker" / "Dockerfile.cpu",
               ROOT / "docker" / "local" / "Dockerfile"]
FLOWER_IMAGES = ("flwr/superlink", "flwr/supernode", "flwr/superexec")
# An image reference with a literal tag (not ${...}); a sentence's full stop is not part of it.
IMAGE_REF = re.compile(r"((?:flwr/(?:superlink|supernode|superexec))|fedowen-superexec|"
                       r"fedowen/debian):([0-9A-Za-z][\w.-]*[\w])")


def script_value(name: str) -> str:
    """The value a top-level ``NAME=...`` line of the build script assigns (quotes dropped)."""
    match = re.search(rf"^{name}=(.*)$", SCRIPT.read_text(), re.MULTILINE)
    assert match, f"scripts/docker-images.sh no longer assigns {name}"
    return match.group(1).strip().strip('"')


def flwr_pin() -> str:
    lock = (ROOT / "requirements" / "lock.txt").read_text()
    match = re.search(r"^flwr==(\S+)$", lock, re.MULTILINE)
    assert match, "no flwr== pin in requirements/lock.txt"
    return match.group(1)


def archs() -> list[str]:
    return script_value("SUPPORTED_ARCHS").split()


def built_refs() -> dict[str, set[str]]:
    """Every image reference the script can make: plain reference -> it and its arch tags."""
    plain = [f"{name}:{flwr_pin()}" for name in FLOWER_IMAGES]
    plain += [script_value(v) for v in ("APP_IMAGE", "SLIM_IMAGE", "BASE_IMAGE")]
    return {ref: {ref, *(f"{ref}-{arch}" for arch in archs())} for ref in plain}


def all_built() -> set[str]:
    return set().union(*built_refs().values())


def refs_in(text: str) -> set[str]:
    return {f"{name}:{tag}" for name, tag in IMAGE_REF.findall(text)}


def test_script_supports_amd64_and_arm64() -> None:
    # Assert: the architectures the issue asks for, in Debian's names (dpkg, debootstrap)
    assert archs() == ["amd64", "arm64"]
    assert script_value("ARCHS") == "${ARCHS:-$NATIVE_ARCH}"


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_files_name_only_built_images(path: Path) -> None:
    # Prepare
    text = path.read_text()
    # an image from the environment counts by its default: ${VAR:-image}
    images = [re.sub(r"^\$\{\w+:-(.*)\}$", r"\1", image)
              for image in re.findall(r"^\s+image:\s*(\S+)", text, re.MULTILINE)]

    # Assert
    assert images, f"{path.name} names no image"
    unknown = sorted(set(images) - all_built())
    assert not unknown, f"{path.name} names images the build script does not make: {unknown}"
    for version in re.findall(r"FLWR_VERSION:\s*(\S+)", text):
        assert version == flwr_pin(), f"{path.name}: build arg FLWR_VERSION {version}"


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_platform_matches_the_tag(path: Path) -> None:
    # Prepare: each service block (two-space indent) with its platform and image
    blocks = re.split(r"^  (?=[\w-]+:\s*$)", path.read_text(), flags=re.MULTILINE)

    # Assert: a service pinned to an architecture runs that architecture's tag
    for block in blocks:
        platform = re.search(r"^\s+platform:\s*(?:linux/)?(\S+)", block, re.MULTILINE)
        image = re.search(r"^\s+image:\s*(\S+)", block, re.MULTILINE)
        if platform and image:
            arch = re.sub(r"^\$\{\w+:-linux/(.*)\}$", r"\1", platform.group(1))
            name = re.sub(r"^\$\{\w+:-(.*)\}$", r"\1", image.group(1))
            assert name.endswith(f"-{arch}"), block[:200]


def test_dockerfiles_default_to_the_pinned_flower() -> None:
    for path in DOCKERFILES:
        assert f"ARG FLWR_VERSION={flwr_pin()}" in path.read_text(), path


@pytest.mark.parametrize("path", [DOCS, ROOT / "README.md", *COMPOSE_FILES, *DOCKERFILES,
                                  SCRIPT], ids=lambda p: p.name)
def test_text_names_only_built_images(path: Path) -> None:
    # Prepare: REF-ARCH stands for every architecture's tag of REF
    named = {ref.removesuffix("-ARCH") for ref in refs_in(path.read_text())}

    # Assert
    unknown = sorted(named - all_built())
    assert not unknown, f"{path.relative_to(ROOT)} names images nobody builds: {unknown}"


def test_docs_table_lists_every_tag() -> None:
    # Prepare: the docs' section on architectures and tags
    text = DOCS.read_text()
    start = text.index("### Architectures and tags")
    section = text[start:text.index("\n### ", start + 1)]

    # Assert: every reference the script can make, each with its architectures
    missing = sorted(all_built() - refs_in(section))
    assert not missing, f"docs/deployment.md's tag table lacks {missing}"
    for arch in archs():
        assert f"`{arch}`" in section, f"the tag table does not name {arch}"
