"""Output text: incremental detokenization and stop strings (router and engine alike).

    detokenizer   incremental decoding of output ids (tokenizers' DecodeStream) into text deltas
    stop_strings  stop-string matching and hold-back over text chunks (the detokenizer's text side)
"""
