"""Shared helpers for the training scripts."""
import lzma
import os
import random
import struct
import sys
import time

import numpy as np
import torch

T0 = time.time()


def log(*a):
    print('[%7.1fs %s]' % (time.time() - T0, time.strftime('%H:%M:%S')), *a, flush=True)


def seed_all(s):
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(s)


def load_u16(path):
    """uint16 little-endian id file, optionally .xz compressed -> np.int64 array."""
    with (lzma.open(path, 'rb') if path.endswith('.xz') else open(path, 'rb')) as fh:
        b = fh.read()
    return np.frombuffer(b, dtype='<u2').astype(np.int64)


def exact_fp32():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        torch.set_float32_matmul_precision('highest')
    except Exception:
        pass


def device():
    return torch.device('cuda' if torch.cuda.is_available() else 'cpu')


def autocast(dev):
    if dev.type == 'cuda':
        return torch.autocast('cuda', dtype=torch.bfloat16)
    import contextlib
    return contextlib.nullcontext()
