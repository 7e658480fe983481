"""The wheel's packages, discovered: the repository root is the `trajlake` package, and every folder below it
with an __init__.py is one of its subpackages (tests, bench and docs are not packages and stay out)."""

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    """Leaves this file out of the wheel: it sits in the package's folder but is not part of the package."""

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if (m[0], m[1]) != ("trajlake", "setup")]


setup(packages=["trajlake"] + [f"trajlake.{p}" for p in find_packages(".", exclude=["tests*", "bench*", "docs*"])],
      cmdclass={"build_py": BuildPy})
