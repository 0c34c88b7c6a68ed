"""A job's program for tests/python/test_binding.py: deadpool.torch with state of the rank's own,
the torch RNG (rng=True: dropout draws from it) and a data cursor that the RNG moves forward
(stateful=[cursor]), so that a replacement that did not restore both would train on other
batches and other dropout masks. Writes OUT/tiny.pt on rank 0. argv[1]: "zero" for ZeRO-1."""
import os
import sys

import torch

import deadpool.torch as dpt


class Cursor:
    """Where this rank reads next in its stream; it moves by a random stride each step."""

    def __init__(self):
        self.pos = 0

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, sd):
        self.pos = sd["pos"]


torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
ft = dpt.FaultTolerant()
torch.manual_seed(ft.seed)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
cursor = Cursor()
if not ft.join(model, opt, zero=len(sys.argv) > 1 and sys.argv[1] == "zero", stateful=[cursor], rng=True):
    sys.exit(ft.finish())
data = torch.randn(4096, 9, generator=torch.Generator().manual_seed(7))
for step in ft.steps():
    rows = data[[(cursor.pos + 31 * ft.rank + i) % 4096 for i in range(16)]]
    cursor.pos += int(torch.randint(1, 50, (1,)))
    loss = torch.nn.functional.mse_loss(model(rows[:, :8]), rows[:, 8:])
    opt.zero_grad()
    loss.backward()
    if not ft.reduce_gradients(loss):
        continue
    opt.step()
    ft.commit()
sys.exit(ft.finish(lambda: torch.save(model.state_dict(), os.path.join(ft.out_dir, "tiny.pt"))))
