"""Package discovery for evenflow's layout: the top-level folders are ``evenflow.<folder>``.

setuptools' own ``find`` cannot add the ``evenflow.`` prefix, and a hand-kept list misses new
subpackages. Every directory under the top-level folders is a package, data-only ones
(``loadtest/scenarios``) included, so nothing can be left out and setuptools has nothing to warn
about. Everything else is in pyproject.toml.
"""

from pathlib import Path

from setuptools import setup

TOP_LEVEL = ("proto", "server", "balancer", "client", "loadtest")
DATA_FILES = ["*.proto", "*.pyi", "*.toml", "*.json", "*.html", "py.typed"]


def discover(root: Path) -> list[str]:
    packages = []
    for top in TOP_LEVEL:
        for folder in [root / top, *sorted((root / top).rglob("*"))]:
            relative = folder.relative_to(root)
            if folder.is_dir() and "__pycache__" not in relative.parts:
                packages.append("evenflow." + ".".join(relative.parts))
    return packages


setup(
    packages=discover(Path(__file__).resolve().parent),
    package_dir={f"evenflow.{top}": top for top in TOP_LEVEL},
    package_data={"": DATA_FILES},
)
