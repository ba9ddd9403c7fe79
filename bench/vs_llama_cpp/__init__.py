"""Tandem against llama.cpp: the same GGUF and threads, one run."""
