"""Which versions of which distributions are installed (for manifests, notes and doctor)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def installed_version(package: str) -> str | None:
    """The installed version of distribution ``package``, or ``None`` when it is not installed."""
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def installed_versions(packages: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``{package: version}`` for those of ``packages`` that are installed."""
    return {p: v for p in packages if (v := installed_version(p)) is not None}
