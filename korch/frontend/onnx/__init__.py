"""The ONNX front end: the importer and its fission rules (rules_*), one module per family of operators."""
