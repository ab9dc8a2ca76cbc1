"""Files running and training both read or write: tokenizers, chat templates, data rows and
labelled rows, atomic writes and the output folder's lock."""
