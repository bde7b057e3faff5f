"""Plain names of the adapter axes (no imports): what `lorarl.language.config` validates against.

The registry (`lorarl.adapters.registry`) must register exactly these methods; a test checks it.
"""

METHODS = (
    "full",  # full fine-tuning, optionally restricted by a sparse `mask`
    "lora",  # LoRA (Hu et al.)
    "dora",  # DoRA: magnitude/direction decomposition (peft use_dora)
    "rslora",  # rank-stabilised LoRA: scale alpha/sqrt(r) (peft use_rslora)
    "adalora",  # AdaLoRA: SVD-form adapter with budgeted rank allocation (peft AdaLoraConfig)
    "miss",  # MiSS: shard-shared single matrix (peft MissConfig)
    "vera",  # VeRA: frozen shared random projections, trained scaling vectors (peft VeraConfig)
    "ia3",  # IA3: learned rescaling of K, V and the FFN input (peft IA3Config)
    "ln_tuning",  # LayerNorm tuning (peft LNTuningConfig)
    "lora_plus",  # LoRA with the LoRA+ optimiser: lr_B = lr_ratio * lr_A (peft create_loraplus_optimizer)
    "lora_fa",  # LoRA-FA: A frozen, B trained with the projected-gradient optimiser (peft create_lorafa_optimizer)
)

INITS = (
    "kaiming",  # peft's default LoRA init: A ~ kaiming-uniform(a=sqrt 5) = U(-1/sqrt n, 1/sqrt n), B = 0
    "gaussian",  # standard LoRA as in the init study: A ~ N(0, 1/n), B = 0
    "pissa",  # B = U_r (S_r/s)^1/2, A = (S_r/s)^1/2 V_r^T: s B A = U_r S_r V_r^T (peft's), residual W0 - s B A frozen
    "milora",  # same with the bottom-r singular triplets
    "olora",  # B = U_r, A = V_r^T, residual
    "olora_tail",  # B = U_-r, A = V_-r^T, residual
    "rlpo",  # B = 0, A = V_r^T
    "rlmo",  # B = 0, A = V_-r^T
    "dct",  # B = 0, A = first r rows of the orthonormal DCT-II matrix
    "wavelet",  # B = 0, A = Q^T, QR of the row-wise Haar transform of a Gaussian r x n matrix (transposed)
)

MASKS = (
    "principal",  # top-alpha fraction of |rank-k SVD reconstruction of W0|
    "nonprincipal",  # its complement
    "low_magnitude",  # bottom-alpha fraction of |W0|
    "safe",  # low_magnitude | nonprincipal
    "random",  # random positions, same per-matrix density as `safe`
)

# Inits that rewrite the frozen base weight with a residual (W0 - s B0 A0).
RESIDUAL_INITS = ("pissa", "milora", "olora", "olora_tail")
# Inits with B0 = 0 and row-orthonormal A0 (A0 A0^T = I_r).
ORTHONORMAL_INITS = ("rlpo", "rlmo", "dct", "wavelet")
# Inits that need the SVD of each target weight.
SVD_INITS = ("pissa", "milora", "olora", "olora_tail", "rlpo", "rlmo")
