"""`tracerl train` checks the model before anything loads: each problem is one line naming the
config key and the fix, exit 2, and no run directory is made."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.families import build_family
from tracerl.cli.main import main
from tracerl.config import load_config
from tracerl.config.run import TrainCommandConfig
from tracerl.models import resolve_model
from tracerl.run.preflight import check_model


@pytest.fixture(scope="module")
def no_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny` without a chat template, as a base model comes."""
    import json

    out = tmp_path_factory.mktemp("no-template") / "tiny"
    shutil.copytree(resolve_model("tiny"), out)
    (out / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def train(tmp_path: Path, capsys: pytest.CaptureFixture[str], *overrides: str) -> str:
    """The last line `tracerl train` printed to stderr, which must exit 2 with no run dir."""
    run_dir = tmp_path / "run"
    args = ["train", "examples/tiny.toml", "--run-dir", str(run_dir), *overrides]
    assert main(args) == 2
    assert not run_dir.exists()
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_a_model_that_is_not_there_or_not_a_causal_lm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoConfig

    assert train(tmp_path, capsys, f"--trainer.model={tmp_path}/nothing").startswith(
        f"tracerl: trainer.model: model '{tmp_path}/nothing': not a built-in name"
    )
    vision = tmp_path / "vision"
    AutoConfig.for_model("vit").save_pretrained(vision)
    assert train(tmp_path, capsys, f"--trainer.model={vision}") == (
        f"tracerl: trainer.model: {vision} is a 'vit' model, which transformers has no causal "
        "language model class for; tracerl trains causal LMs"
    )


def test_what_the_engine_cannot_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert train(tmp_path, capsys, "--engine.max_model_len=4096") == (
        "tracerl: engine.max_model_len: 4096 exceeds the 2048 positions of tiny; set it to 2048 "
        "or less"
    )
    gemma = build_family("gemma3", tmp_path / "gemma3")
    assert train(tmp_path, capsys, f"--trainer.model={gemma}", "--engine.forward=slots").startswith(
        f"tracerl: engine.forward: the slot-cache path cannot run {gemma} exactly (it runs "
        "llama, mistral, qwen2, qwen3, qwen2_moe, qwen3_moe, mixtral layouts, not 'gemma3_text')"
    )
    assert train(tmp_path, capsys, "--engine.backend=vllm", "--engine.device=cpu") == (
        "tracerl: engine.backend: vLLM's CPU build has no attention kernel for head size 16 "
        "(tiny); use engine.backend = 'local', or a GPU"
    )


def test_a_chat_template_is_required_and_can_be_supplied(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_template: Path
) -> None:
    assert train(tmp_path, capsys, f"--trainer.model={no_template}") == (
        f"tracerl: trainer.chat_template: {no_template} has no chat template; set "
        "trainer.chat_template to a built-in one (chatml, gemma) or a Jinja file"
    )
    assert train(
        tmp_path, capsys, f"--trainer.model={no_template}", "--trainer.chat_template=nope"
    ) == (
        "tracerl: trainer.chat_template: 'nope' is neither a built-in template (chatml, gemma) "
        "nor a file"
    )
    broken = tmp_path / "broken.jinja"
    broken.write_text("{{ raise_exception('system messages are not supported') }}")
    assert train(
        tmp_path, capsys, f"--trainer.model={no_template}", f"--trainer.chat_template={broken}"
    ) == (
        "tracerl: trainer.chat_template: the chat template does not render a chat: system "
        "messages are not supported"
    )
    for template in ("chatml", "gemma"):  # the built-ins pass
        config = load_config(
            TrainCommandConfig,
            "examples/tiny.toml",
            [f"--trainer.model={no_template}", f"--trainer.chat_template={template}"],
        )
        check_model(config)


def test_a_supplied_template_is_what_the_gateway_renders(tmp_path: Path, no_template: Path) -> None:
    """A run of a model without a template, given `gemma`: every recorded prompt is in
    Gemma's turn format, and the run's export carries the template."""
    import json
    import sqlite3

    from transformers import AutoTokenizer

    from tracerl.chat_templates import GEMMA

    run_dir = tmp_path / "run"
    args = [
        "train", "examples/tiny.toml", "--run-dir", str(run_dir), "--loop.steps=1",
        f"--trainer.model={no_template}", "--trainer.chat_template=gemma",
        "--logging.progress=false",
    ]  # fmt: skip
    assert main(args) == 0
    tokenizer = AutoTokenizer.from_pretrained(no_template)
    with sqlite3.connect(run_dir / "traces.sqlite") as db:
        prompts = [json.loads(d)["prompt_ids"] for (d,) in db.execute("SELECT data FROM turns")]
    assert prompts
    for ids in prompts:
        text = tokenizer.decode(ids)
        assert text.startswith(f"{tokenizer.bos_token}<start_of_turn>user\n"), text
        assert text.endswith("<end_of_turn>\n<start_of_turn>model\n"), text
    assert main(["export", str(run_dir), str(tmp_path / "out")]) == 0
    assert AutoTokenizer.from_pretrained(tmp_path / "out").chat_template == GEMMA


def test_serve_takes_a_chat_template_for_a_model_without_one(
    tmp_path: Path, no_template: Path
) -> None:
    """`tracerl serve` (and `tracerl gateway`) take `gateway.chat_template`; without one, a
    model with no template is one line and exit 2, not a traceback."""
    import subprocess
    import sys

    serve = [
        sys.executable, "-m", "tracerl.cli.main", "serve", "--model", str(no_template),
        "--port", "0", "--demo", "--store", str(tmp_path / "traces.sqlite"),
    ]  # fmt: skip
    missing = subprocess.run(serve, capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2, missing.stderr
    assert missing.stderr.strip().splitlines()[-1] == (
        f"tracerl: gateway.chat_template: {no_template} has no chat template; set "
        "--gateway.chat_template to a built-in one (chatml, gemma) or a Jinja file"
    )
    given = subprocess.run(
        [*serve, "--gateway.chat_template=gemma"], capture_output=True, text=True, timeout=300
    )
    assert given.returncode == 0, given.stderr
    import json
    import sqlite3

    from transformers import AutoTokenizer

    with sqlite3.connect(tmp_path / "traces.sqlite") as db:
        (data,) = db.execute("SELECT data FROM turns").fetchone()
    prompt = AutoTokenizer.from_pretrained(no_template).decode(json.loads(data)["prompt_ids"])
    assert prompt.startswith("<|im_start|><start_of_turn>user\n"), (
        prompt
    )  # tiny's bos, then Gemma's turns
