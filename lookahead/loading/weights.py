"""How ``load_model`` holds a GGUF's weights (``weights=``, ``products=``), importable without torch (the CLI's
options)."""

# "auto": "quantized" on the CPU in float32, else "dequantized"; "quantized": the file's block formats;
# "dequantized": float32.
WEIGHTS = ("auto", "quantized", "dequantized")
# How kept blocks multiply (model/products.py): "auto", each format the faster of the two as measured on this
# machine; "float32", the de-quantized weights' values (the float model's numbers); "int8", the inputs rounded
# to 8 bits and exact integer sums, as llama.cpp computes.
PRODUCTS = ("auto", "float32", "int8")
