"""The embedding path's pure parts outside the vectors: the embedder's config and model
directory, the preprocessor's tokenization and checks, the router's worker choice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.cli.stack import Stack, StackConfig
from services.embedder.config import EmbedderConfig
from services.embedder.model import (
    DEFAULT_EMBEDDING_MODEL,
    ensure_embedding_model_dir,
    vector_size,
)
from services.preprocessor.embed import InputTooLong, tokenize
from services.preprocessor.tokenizer import WANTED_FILES, ModelAssets, load_assets
from services.router.embeds import choose
from services.router.load import WorkerReports
from shared.errors import InvalidRequest
from shared.messages import Embed, ModelCard, WorkerCard, WorkerLoad
from shared.model_dir import context_length

TEXT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_embedding_model_dir(tmp_path_factory.mktemp("qwen3-embedding"))


@pytest.fixture(scope="module")
def assets(model_dir: Path) -> ModelAssets:
    files = {name: (model_dir / name).read_bytes() for name in WANTED_FILES}
    card = ModelCard(model=DEFAULT_EMBEDDING_MODEL, context_length=16, kind="embedding")
    return load_assets(card, files)


class TestConfig:
    def test_defaults(self) -> None:
        config = EmbedderConfig.from_cli([], environ={})
        assert (config.model_name, config.embedding_size, config.model_path) == (
            "Qwen/Qwen3-Embedding-0.6B",
            0,
            None,
        )

    def test_random_worker_ids_are_distinct(self) -> None:
        a, b = EmbedderConfig().worker_id, EmbedderConfig().worker_id
        assert (a.startswith("embedder-"), a != b) == (True, True)

    def test_env_vars_are_read(self) -> None:
        environ = {"JETSERVE_EMBEDDER_MODEL_NAME": "e5", "JETSERVE_EMBEDDER_EMBEDDING_SIZE": "64"}
        config = EmbedderConfig.from_cli([], environ=environ)
        assert (config.model_name, config.embedding_size) == ("e5", 64)

    def test_a_worker_id_that_is_no_subject_token_is_refused(self) -> None:
        with pytest.raises(ValueError, match="worker-id"):
            EmbedderConfig(worker_id="a.b")


class TestModelDir:
    def test_has_the_qwen3_tokenizer_and_the_embedding_models_config(self, model_dir: Path) -> None:
        config = json.loads((model_dir / "config.json").read_text())
        assert (model_dir / "tokenizer.json").is_file()
        assert (config["hidden_size"], config["vocab_size"]) == (1024, 151669)

    def test_size_and_context_come_from_config_json(self, model_dir: Path) -> None:
        assert (vector_size(model_dir), context_length(model_dir)) == (1024, 32768)

    def test_size_without_a_config_is_the_default(self, tmp_path: Path) -> None:
        assert vector_size(tmp_path, default=7) == 7

    def test_writing_it_again_changes_nothing(self, model_dir: Path) -> None:
        before = (model_dir / "config.json").stat().st_mtime_ns
        ensure_embedding_model_dir(model_dir)
        assert (model_dir / "config.json").stat().st_mtime_ns == before


def embed(**fields: object) -> Embed:
    return Embed(request_id="r", model=DEFAULT_EMBEDDING_MODEL, reply_to="x", **fields)  # type: ignore[arg-type]


class TestTokenize:
    def test_texts_are_tokenized_with_the_models_tokenizer(self, assets: ModelAssets) -> None:
        expected = tuple(assets.tokenizer.encode(TEXT).ids)
        assert tokenize(embed(texts=(TEXT, "hi")), assets)[0] == expected

    def test_token_ids_pass_as_given(self, assets: ModelAssets) -> None:
        assert tokenize(embed(token_ids=((1, 2), (3,))), assets) == ((1, 2), (3,))

    def test_a_token_id_outside_the_vocabulary_is_400(self, assets: ModelAssets) -> None:
        with pytest.raises(InvalidRequest, match="input 1: token id 151669 is out of vocabulary"):
            tokenize(embed(token_ids=((1,), (151669,))), assets)

    def test_an_input_longer_than_the_context_is_400(self, assets: ModelAssets) -> None:
        long = " ".join(["word"] * 40)
        with pytest.raises(InputTooLong, match="input 1 has 40 tokens") as err:
            tokenize(embed(texts=("hi", long)), assets)
        assert (err.value.code, err.value.status, err.value.param) == (
            "context_length_exceeded",
            400,
            "input",
        )

    def test_no_input_is_400(self, assets: ModelAssets) -> None:
        with pytest.raises(InvalidRequest, match="must not be empty"):
            tokenize(embed(), assets)

    def test_an_input_without_tokens_is_400(self, assets: ModelAssets) -> None:
        with pytest.raises(InvalidRequest, match="input 0 has no tokens"):
            tokenize(embed(texts=("",)), assets)

    def test_texts_and_token_ids_together_are_400(self, assets: ModelAssets) -> None:
        with pytest.raises(InvalidRequest, match="not both"):
            tokenize(embed(texts=("a",), token_ids=((1,),)), assets)


def card(worker_id: str) -> WorkerCard:
    return WorkerCard(worker_id=worker_id, model="m", kind="embedder")


class TestChoose:
    def test_equal_workers_take_turns_in_id_order(self) -> None:
        live = [card("b"), card("a")]
        chosen = [choose(live, WorkerReports(), 0.0, turn).worker_id for turn in range(4)]
        assert chosen == ["a", "b", "a", "b"]

    def test_the_least_loaded_worker_wins(self) -> None:
        reports = WorkerReports()
        reports.update(WorkerLoad(worker_id="a", active=3, waiting=1), 0.0)
        reports.update(WorkerLoad(worker_id="b", active=1), 0.0)
        live = [card("a"), card("b"), card("c")]
        reports.update(WorkerLoad(worker_id="c", active=2), 0.0)
        assert [choose(live, reports, 0.0, t).worker_id for t in range(2)] == ["b", "b"]

    def test_stale_reports_count_as_idle(self) -> None:
        reports = WorkerReports(stale_s=1.0)
        reports.update(WorkerLoad(worker_id="a", active=5), 0.0)
        live = [card("a"), card("b")]
        assert [choose(live, reports, 10.0, t).worker_id for t in range(2)] == ["a", "b"]


class TestStackPlan:
    def names(self, plan: list[tuple[str, list[str]]]) -> list[str]:
        return [name for name, _ in plan]

    def test_no_embedder_unless_asked(self, tmp_path: Path) -> None:
        plan = Stack(StackConfig(run_dir=tmp_path)).plan()
        assert not [n for n in self.names(plan) if n.startswith("embedder")]

    def test_embedders_are_numbered_and_get_the_model_name(self, tmp_path: Path) -> None:
        config = StackConfig(run_dir=tmp_path, embedders=2, embedding_model_name="e5")
        plan = dict(Stack(config).plan())
        assert [n for n in plan if n.startswith("embedder")] == ["embedder-0", "embedder-1"]
        assert plan["embedder-1"][-4:] == ["-m", "services.embedder", "--model-name", "e5"]

    def test_embedders_start_before_the_gateway(self, tmp_path: Path) -> None:
        names = self.names(Stack(StackConfig(run_dir=tmp_path, embedders=1)).plan())
        assert names.index("embedder-0") < names.index("gateway")
