"""How ``load_model`` holds a GGUF's weights (``weights=``), importable without torch (the CLI's options)."""

# "auto": "quantized" on the CPU in float32, else "dequantized"; "quantized": the file's block formats, float32
# products; "dequantized": float32. (The integer products of native/quant8.cpp are not offered here: the
# step's attention does not give a row the same bits at every row count, and rounding the inputs to 8 bits
# turns that last-bit difference into another token; docs/DESIGN.md, "Weights as shipped".)
WEIGHTS = ("auto", "quantized", "dequantized")
