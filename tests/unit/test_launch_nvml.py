"""shoal.launch.nvml against a stand-in for nvidia-ml-py's module (the real one, on a GPU host,
is exercised by tests/gpu): NVML is shut down after every call that initialised it, a GPU whose
name cannot be read keeps its place, and without a driver every call says "no GPUs"."""

import sys
import types

import pytest

from shoal.launch import nvml


class FakeNvml(types.ModuleType):
    """pynvml's calls that shoal.launch.nvml makes, for a host with `uuids` (None: unreadable)."""

    class NVMLError(Exception):
        pass

    def __init__(self, uuids, init_fails=False):
        super().__init__("pynvml")
        self.uuids, self.init_fails, self.open = uuids, init_fails, 0

    def nvmlInit(self):
        if self.init_fails:
            raise self.NVMLError("Driver Not Loaded")
        self.open += 1

    def nvmlShutdown(self):
        self.open -= 1

    def nvmlDeviceGetCount(self):
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetUUID(self, handle):
        if self.uuids[handle] is None:
            raise self.NVMLError("Unknown Error")
        return self.uuids[handle].encode()

    def nvmlDeviceGetName(self, handle):
        return "NVIDIA H200"

    def nvmlDeviceGetUtilizationRates(self, handle):
        raise self.NVMLError("Not Supported")


@pytest.fixture
def host(monkeypatch):
    def install(uuids, init_fails=False):
        fake = FakeNvml(uuids, init_fails)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake
    return install


def test_gpus_are_counted_and_named_in_nvmls_order_and_nvml_is_shut_down_after_each_call(host):
    fake = host(["GPU-aaaa", None, "GPU-cccc"])
    assert nvml.gpu_count() == 3
    assert nvml.gpu_identities() == [nvml.GpuIdentity("GPU-aaaa", "NVIDIA H200"), nvml.GpuIdentity(None, "NVIDIA H200"),
                                     nvml.GpuIdentity("GPU-cccc", "NVIDIA H200")]
    assert nvml.gpu_usage() is None  # an NVML error midway: no figures rather than wrong ones
    assert fake.open == 0


def test_without_a_driver_there_are_no_gpus(host):
    host(["GPU-aaaa"], init_fails=True)
    assert (nvml.gpu_count(), nvml.gpu_identities(), nvml.gpu_usage()) == (0, [], None)


def test_without_nvidia_ml_py_there_are_no_gpus(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert (nvml.gpu_count(), nvml.gpu_identities(), nvml.gpu_usage()) == (0, [], None)
