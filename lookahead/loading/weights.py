"""How ``load_model`` holds a GGUF's weights (``weights=``), importable without torch (the CLI's options)."""

# "auto": "quantized" on the CPU in float32, else "dequantized"; "quantized": the file's block formats, float32
# products; "quantized-int8": the block formats, integer products over int8 inputs; "dequantized": float32
WEIGHTS = ("auto", "quantized", "quantized-int8", "dequantized")
