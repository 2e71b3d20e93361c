"""A stand-in kubelet for the tests: serves the real pod-resources v1 proto (the stubs generated from
k8s.io/kubelet's api.proto) over a unix socket, with pods the test sets and changes between ticks."""

from __future__ import annotations

import os
import threading
from concurrent import futures

import grpc

from ledger.capture.sources.kubelet import api_pb2 as pb
from ledger.capture.sources.kubelet import api_pb2_grpc as pbg


def pod(namespace: str, name: str, devices: dict[str, list[str]], container: str = "main") -> pb.PodResources:
    """One pod, one container, holding ``{resource: [device ids]}`` (the shape the kubelet's List answers)."""
    return pb.PodResources(name=name, namespace=namespace, containers=[pb.ContainerResources(
        name=container, devices=[pb.ContainerDevices(resource_name=r, device_ids=ids,
                                                     topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=0)]))
                                 for r, ids in devices.items()], cpu_ids=[2, 3])])


class StandinKubelet(pbg.PodResourcesListerServicer):
    def __init__(self, socket: str, allocatable: dict[str, list[str]], serve_get: bool = True) -> None:
        self.socket, self.serve_get = socket, serve_get
        self.alloc = allocatable
        self.pods: list[pb.PodResources] = []
        self.calls: list[str] = []
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None

    def start(self) -> "StandinKubelet":
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pbg.add_PodResourcesListerServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        self._server.start()
        return self

    def stop(self) -> None:
        """The socket goes away (kubelet restart, node drain)."""
        if self._server is not None:
            self._server.stop(0).wait()
            self._server = None
        if os.path.exists(self.socket):
            os.unlink(self.socket)

    def set_pods(self, pods: list[pb.PodResources]) -> None:
        with self._lock:
            self.pods = list(pods)

    # the service
    def List(self, request, context):
        self.calls.append("List")
        with self._lock:
            return pb.ListPodResourcesResponse(pod_resources=self.pods)

    def GetAllocatableResources(self, request, context):
        self.calls.append("GetAllocatableResources")
        return pb.AllocatableResourcesResponse(devices=[pb.ContainerDevices(resource_name=r, device_ids=ids)
                                                        for r, ids in self.alloc.items()], cpu_ids=[0, 1, 2, 3])

    def Get(self, request, context):
        self.calls.append("Get")
        if not self.serve_get:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "PodResources API Get method disabled")
        with self._lock:
            for p in self.pods:
                if p.name == request.pod_name and p.namespace == request.pod_namespace:
                    return pb.GetPodResourcesResponse(pod_resources=p)
        context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_name} not found")
