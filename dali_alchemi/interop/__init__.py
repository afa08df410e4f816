"""Meeting users where their data and models are: ASE files in, nvalchemi and PyTorch Geometric out.

Optional packages (ase, nvalchemi-toolkit, torch_geometric) are imported only when used.
"""
