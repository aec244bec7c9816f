"""FENS: one upload of the client models, then FL rounds of a small aggregator.

Allouah et al., "Revisiting Ensembling in One-Shot Federated Learning"
(NeurIPS 2024), method ``fens``, as the authors' public code runs it
(``sacs-epfl/fens`` at commit a349903; the paper's body was not available
here, its abstract and headline numbers were, so where a detail is the code's
the code was followed). Two phases:

1. **One shot.** Every client holds a share of its data out (``holdout``,
   0.1: :mod:`.holdout`), trains its model on the rest (the shared, cached
   client step of FedAvg and Ensemble, keyed on the data it trains on) and
   uploads it once with INT8 weights (``quantize: int8``, :mod:`.quantize`).
2. **Federated aggregator.** The server relays the K models to every client
   once (round 1); each client runs them over its held-out share only and
   keeps those logits (its own ``ClientState``: they never leave it). For
   ``rounds`` FL rounds (500) the clients train the aggregator
   ``fc2(relu(fc1(concat_k f_k(x))))`` (K·C → 2K → C, :mod:`.aggregator`)
   with one SGD step at lr 1 on a batch of 128, and the server combines the
   round's aggregators (``server.aggregator``, the mean weighted by the
   samples each saw) and takes a FedAdam step (lr 1e-3, β = (0.9, 0.99),
   τ = 1e-3, :mod:`osfl.fl.server_optim`).

The predictor is the aggregator over the (dequantised) client models'
logits. FENS is not strictly one-shot: its record counts 1 + ``rounds``
communication rounds and the bytes of each (the K models relayed to every
client in round 1 dominate them); docs/methods/fens.md says why that is the
point of the paper and lists every remaining departure from the code.
"""

from osfl.methods.fens.aggregator import FENSPredictor, LogitAggregator, train_aggregator
from osfl.methods.fens.config import AggregatorLocalConfig, FENSConfig
from osfl.methods.fens.holdout import holdout_indices, split_client_data
from osfl.methods.fens.method import FENS
from osfl.methods.fens.quantize import (
    dequantize_int8,
    int8_spec,
    quantize_int8,
    quantized_keys,
)

__all__ = [
    "FENS",
    "AggregatorLocalConfig",
    "FENSConfig",
    "FENSPredictor",
    "LogitAggregator",
    "dequantize_int8",
    "holdout_indices",
    "int8_spec",
    "quantize_int8",
    "quantized_keys",
    "split_client_data",
    "train_aggregator",
]
