"""The PyTorch front end: torch.export graphs lowered through aten fission rules."""
