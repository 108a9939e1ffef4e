import torch

# Two cores run the whole suite; more threads only thrash.
torch.set_num_threads(2)
