"""Export to other engines: the writer, and one module per format (CTranslate2, Hugging Face)."""
