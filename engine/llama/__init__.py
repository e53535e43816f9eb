"""The binding to llama.cpp: a loaded model, its contexts, sampling, the log route, the GGUF
header reader, and the GPU PLE provider our patched llama.cpp calls while it builds a graph.

Everything that calls `llama_cpp` directly lives here; the rest of the engine asks these
wrappers and never holds a raw pointer.
"""
