"""The DCP export (issue 49): torch.distributed.checkpoint.load reads it into a plain
nn.Module, with the module's names, from a ZeRO run, a plain run or a checkpoint file."""

import os

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ssaexec as se
from ssaexec.core.errors import ProgramError, SSAExecError
from ssaexec.program.example_models import build_mlp

# torch says it reads "in a single process" without a process group: that is the point here
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class Tied(torch.nn.Module):
    """A linear layer, batch norm (buffers), and an output layer tied to an embedding-like
    weight (one Parameter under two names)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 5)
        self.bn = torch.nn.BatchNorm1d(5)
        self.b = torch.nn.Linear(5, 5)
        self.c = torch.nn.Linear(5, 5, bias=False)
        self.c.weight = self.b.weight

    def forward(self, x):
        h = torch.relu(self.bn(self.a(x)))
        return self.c(self.b(h))


def _load(module, folder):
    fresh = {k: torch.zeros_like(v) for k, v in module.state_dict().items()}
    dcp.load(fresh, checkpoint_id=str(folder))  # no process group: torch's own single reader
    module.load_state_dict(fresh)
    return module


def _torch_run(stage, places):
    torch.manual_seed(0)
    model = Tied().double()
    g = torch.Generator().manual_seed(1)
    x, t = (torch.randn(8, n, dtype=torch.float64, generator=g) for n in (4, 5))
    main, startup, loss = se.from_torch(model, {"x": x, "target": t},
                                        loss_fn=torch.nn.functional.mse_loss,
                                        optimizer=se.optimizer.AdamW(0.01))
    pe = se.ParallelExecutor(se.cpu_places(places), main, startup, loss,
                             se.BuildStrategy(zero_stage=stage), scope=se.Scope())
    for _ in range(2):
        pe.run([loss], feed={"x": x, "target": t})
    return model, pe


@pytest.mark.parametrize("stage,places", [(3, 2), (0, 2)])
def test_an_imported_module_loads_its_trained_state_from_the_export(tmp_path, stage, places):
    model, pe = _torch_run(stage, places)
    with pe:
        keys = se.export_dcp(pe, tmp_path / "dcp", module=model)
        trained = pe.gathered_state() if pe.shard_layout() is not None else \
            {k: pe.get_var(k) for k in keys if k != "c.weight"}
    assert keys == sorted(model.state_dict())  # the tied name too
    assert "a.weight_moment1_0" not in keys  # the model's state, not the optimizer's
    loaded = _load(Tied().double(), tmp_path / "dcp")
    for key, value in loaded.state_dict().items():
        want = trained["b.weight" if key == "c.weight" else key]
        assert torch.equal(value, want), key
    assert not torch.equal(loaded.a.weight, model.a.weight)  # trained, not the initial


def test_a_builder_program_exports_its_var_names_and_a_checkpoint_file_converts(tmp_path):
    main, startup, loss = build_mlp("float64", se.optimizer.SGD(0.1), in_dim=6, hidden=(5,),
                                    classes=3)
    with se.ParallelExecutor(se.cpu_places(4), main, startup, loss,
                             se.BuildStrategy(zero_stage=2), scope=se.Scope()) as pe:
        x = torch.randn(8, 6, dtype=torch.float64)
        pe.run([loss], feed={"img": x, "label": x[:, :3].argmax(1, keepdim=True)})
        keys = se.export_dcp(pe, tmp_path / "dcp")
        se.save_checkpoint(tmp_path / "c.safetensors", pe)  # sharded, 4 files
        trained = pe.gathered_state()
    assert keys == ["fc_0.b_0", "fc_0.w_0", "fc_1.b_0", "fc_1.w_0"]
    model = torch.nn.Module()  # a plain module with the program's names
    for layer in ("fc_0", "fc_1"):
        sub = torch.nn.Module()
        sub.w_0 = torch.nn.Parameter(torch.zeros_like(trained[f"{layer}.w_0"]))
        sub.b_0 = torch.nn.Parameter(torch.zeros_like(trained[f"{layer}.b_0"]))
        setattr(model, layer, sub)
    for folder in ("dcp", "from_file"):
        if folder == "from_file":
            se.export_dcp(tmp_path / "c.safetensors", tmp_path / folder, program=main)
        _load(model, tmp_path / folder)
        for k, v in model.state_dict().items():
            assert torch.equal(v, trained[k]), (folder, k)


def test_the_export_refuses_what_does_not_fit_and_replaces_only_an_export(tmp_path):
    model, pe = _torch_run(0, 1)
    with pe:
        other = torch.nn.Linear(4, 5).double()
        with pytest.raises(ProgramError, match=r"export_dcp: Linear does not match the "
                                               r"program: weight: not in the program"):
            se.export_dcp(pe, tmp_path / "x", module=other)
        assert not (tmp_path / "x").exists()
        precious = tmp_path / "precious"
        precious.mkdir()
        (precious / "notes.txt").write_text("mine")
        with pytest.raises(SSAExecError, match="a folder that is not a DCP export"):
            se.export_dcp(pe, precious, module=model)
        assert os.listdir(precious) == ["notes.txt"]
        (tmp_path / "file").write_text("")
        with pytest.raises(SSAExecError, match="exists and is not a folder"):
            se.export_dcp(pe, tmp_path / "file", module=model)
        se.export_dcp(pe, tmp_path / "dcp", module=model)
        pe.set_var("a.bias", torch.full([5], 3.0, dtype=torch.float64))
        se.export_dcp(pe, tmp_path / "dcp", module=model)  # an export is replaced whole
    assert torch.equal(_load(Tied().double(), tmp_path / "dcp").a.bias,
                       torch.full([5], 3.0, dtype=torch.float64))
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith(".dcp-")) == []
    with pytest.raises(SSAExecError, match="needs program= or module="):
        se.export_dcp(tmp_path / "none.safetensors", tmp_path / "y")
