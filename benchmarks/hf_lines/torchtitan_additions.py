"""Not run: what torchtitan_llama.toml needs besides torchtitan's source tree, counted for
RESULTS.md: the model's sizes as a flavor (an entry of MODEL_FLAVORS in
torchtitan/experiments/transformers_modeling_backend/flavors.py, written as its
"debugmodel" entry), and the data as a registered dataset (a loader and a sample
processor, registered as torchtitan's docs/datasets.md shows; the docs edit the file
itself, this adds the entries from outside)."""

from datasets import load_dataset
from torchtitan.datasets.hf_datasets import DATASET_LOADERS, DATASET_TEXT_PROCESSORS
from torchtitan.experiments.transformers_modeling_backend.flavors import (
    MODEL_FLAVORS,
    HFTransformerModel,
    TitanModelConfig,
)

MODEL_FLAVORS["tinyllama"] = HFTransformerModel.Config(
    model_config=TitanModelConfig(
        dim=128,
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=256,
        intermediate_size=512,
    ),
)


def load_tinyshakespeare(dataset_path: str, **kwargs):
    return load_dataset("text", data_files="input.txt", split="train", streaming=True)


def process_tinyshakespeare_text(sample):
    return sample["text"]


DATASET_LOADERS["tinyshakespeare"] = load_tinyshakespeare
DATASET_TEXT_PROCESSORS["tinyshakespeare"] = process_tinyshakespeare_text
