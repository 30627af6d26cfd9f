"""What machine this is, in words a result file and a cache key can carry."""

from __future__ import annotations

import platform


def cpu_name() -> str:
    """The CPU's model name, with its family and model numbers and its widest vector extension where
    /proc/cpuinfo gives them ('<model name> (family 26, model 2, AVX-512)': the name alone is the same for
    CPUs generations apart), or the machine type where it cannot be read."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if not key.strip():
                    break  # (the first processor's block is enough)
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name")
    if not name:
        return platform.processor() or platform.machine()
    flags = set(fields.get("flags", "").split())
    widest = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else None
    about = [f"family {fields['cpu family']}" if "cpu family" in fields else None,
             f"model {fields['model']}" if "model" in fields else None, widest]
    said = ", ".join(part for part in about if part)
    return f"{name} ({said})" if said else name
