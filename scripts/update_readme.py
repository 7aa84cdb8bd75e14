"""Regenerate the configuration reference section of README.md from voxrelay/config.py."""

from pathlib import Path

from voxrelay.config import reference_markdown

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def render(readme: str) -> str:
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{reference_markdown()}{END}{tail}"


if __name__ == "__main__":
    path = Path(__file__).parents[1] / "README.md"
    path.write_text(render(path.read_text()))
