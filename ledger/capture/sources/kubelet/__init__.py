"""The kubelet's PodResources API (``v1.PodResourcesLister``), read-only: which pod and container hold which
device on this node, over the kubelet's unix socket.

* Stubs: ``api_pb2.py`` / ``api_pb2_grpc.py`` are generated, unchanged, from the real k8s.io/kubelet
  ``pkg/apis/podresources/v1/api.proto`` (carried as tests/fixtures/kubelet/api.proto with its source) by
  ``python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. api.proto`` (the one import line of the
  grpc stub made relative). ``grpcio`` is the optional ``kubernetes`` extra; without it the client says so.
* :func:`assignments` is pure: a ``ListPodResourcesResponse`` in, one :class:`Assignment` per
  (pod, container, device id) out. :func:`physical_device` turns the device id a device plugin advertises into
  the physical device: the NVIDIA plugin's time-slicing replicas ``GPU-<uuid>::<n>`` name GPU ``GPU-<uuid>``
  (receipts name the physical device, never the replica); a MIG device UUID (``MIG-...``) is its own device.
* :class:`PodResourcesClient` calls ``List``, ``GetAllocatableResources`` and ``Get`` (``None`` where the
  kubelet does not serve it: the ``KubeletPodResourcesGet`` gate before 1.34). Nothing here writes to the
  kubelet: the service has no writing call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
# Resources that are accelerators (device plugins' names; MIG strategies "single" and "mixed"); anything else a
# pod holds (hugepages, SR-IOV NICs) is not a GPU and is not billed here.
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-", "amd.com/gpu", "gpu.intel.com/")


class KubeletUnavailable(RuntimeError):
    """The socket is missing, refuses, times out, or grpc is not installed: the kubelet's view is unknown."""


@dataclass(frozen=True)
class Assignment:
    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str        # as the kubelet reports it (may be a time-slicing replica id)
    device: str           # the physical device (or MIG slice) it names
    replica: int | None   # the replica number of a time-sliced GPU, else None


def physical_device(device_id: str) -> tuple[str, int | None]:
    """``GPU-<uuid>::3`` -> (``GPU-<uuid>``, 3); anything else names itself."""
    base, sep, rest = device_id.rpartition("::")
    if sep and base and rest.isdigit():
        return base, int(rest)
    return device_id, None


def is_gpu_resource(resource: str) -> bool:
    return resource.startswith(GPU_RESOURCE_PREFIXES)


def _container_devices(namespace: str, pod: str, container: str, devices: Iterable[Any]) -> list[Assignment]:
    out = []
    for cd in devices:
        if not is_gpu_resource(cd.resource_name):
            continue
        for did in cd.device_ids:
            dev, rep = physical_device(did)
            out.append(Assignment(namespace, pod, container, cd.resource_name, did, dev, rep))
    return out


def assignments(resp: Any) -> tuple[Assignment, ...]:
    """Every GPU device id a ``ListPodResourcesResponse`` gives a container, in the response's order."""
    out: list[Assignment] = []
    for pr in resp.pod_resources:
        for c in pr.containers:
            out.extend(_container_devices(pr.namespace, pr.name, c.name, c.devices))
    return tuple(out)


def allocatable(resp: Any) -> tuple[tuple[str, str], ...]:
    """(resource, device id) of every GPU the kubelet can allocate (``AllocatableResourcesResponse``)."""
    return tuple((cd.resource_name, did) for cd in resp.devices if is_gpu_resource(cd.resource_name)
                 for did in cd.device_ids)


class PodResourcesClient:
    """A read-only client of the kubelet's pod-resources socket; one channel, every call bounded by ``timeout``."""

    def __init__(self, socket: str = DEFAULT_SOCKET, timeout: float = 5.0) -> None:
        try:
            import grpc

            from . import api_pb2, api_pb2_grpc
        except ImportError as exc:
            raise KubeletUnavailable(f"grpcio is not installed (pip install 'ipledger[kubernetes]'): {exc}") from None
        self._grpc, self._pb = grpc, api_pb2
        self.socket, self.timeout = socket, timeout
        self._channel = grpc.insecure_channel(f"unix://{socket}")
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "PodResourcesClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout)
        except self._grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            if method == "Get" and code == self._grpc.StatusCode.UNIMPLEMENTED:
                return None
            detail = exc.details() if hasattr(exc, "details") else str(exc)
            raise KubeletUnavailable(f"{self.socket}: {method}: {getattr(code, 'name', code)}: {detail}") from None

    def list(self) -> tuple[Assignment, ...]:
        return assignments(self._call("List", self._pb.ListPodResourcesRequest()))

    def allocatable(self) -> tuple[tuple[str, str], ...]:
        return allocatable(self._call("GetAllocatableResources", self._pb.AllocatableResourcesRequest()))

    def get(self, namespace: str, pod: str) -> tuple[Assignment, ...] | None:
        """One pod's devices, or None where the kubelet does not serve ``Get``."""
        resp = self._call("Get", self._pb.GetPodResourcesRequest(pod_name=pod, pod_namespace=namespace))
        if resp is None:
            return None
        pr = resp.pod_resources
        return tuple(a for c in pr.containers for a in _container_devices(pr.namespace, pr.name, c.name, c.devices))
