"""Hostile YAML the strict loader must refuse quickly: alias bombs ("billion laughs")."""

from __future__ import annotations


def laughs(levels: int = 9, width: int = 9, indent: str = "", leaves: int = 1) -> str:
    """A billion-laughs block as YAML lines at ``indent``: ``l0`` anchors a list of ``leaves``
    strings, each next level a list of ``width`` aliases of the one before (``leaves * width**levels``
    strings once expanded)."""
    lols = ", ".join(['"lol"'] * leaves)
    lines = [f"{indent}l0: &l0 [{lols}]"]
    for level in range(1, levels + 1):
        refs = ", ".join([f"*l{level - 1}"] * width)
        lines.append(f"{indent}l{level}: &l{level} [{refs}]")
    return "\n".join(lines) + "\n"
