"""lookahead's C++ op (linear.cpp), built on first use with torch's extension builder (build.py), and the C entry
points of the numba kernel it calls (entry.py)."""
