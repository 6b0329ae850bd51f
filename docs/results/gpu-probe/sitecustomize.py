# deterministic GPU kernels for a reproducibility probe (FEDOWEN_DET=1 only)
import os

if os.environ.get("FEDOWEN_DET") == "1":
    import torch
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
