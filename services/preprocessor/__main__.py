"""Run the preprocessor: ``python -m services.preprocessor [--help]``."""

from __future__ import annotations

from services.preprocessor.config import PreprocessorConfig
from services.preprocessor.service import build_preprocessor
from shared.lifecycle import service_main


def main(argv: list[str] | None = None) -> None:
    service_main(PreprocessorConfig, build_preprocessor, argv)


if __name__ == "__main__":
    main()
