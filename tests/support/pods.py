"""Run a rendered Kubernetes pod template's container with podman, as a kubelet would.

`workloads(objects)` finds each Deployment/StatefulSet in `kubectl kustomize` output;
`Workload.run_argv(...)` turns its (first) container into one `podman run` command line,
taking from the manifest, not from the test:

  command/args          --entrypoint (JSON) and the arguments after the image
  env                   -e NAME=value; valueFrom secretKeyRef/configMapKeyRef read the
                        test's Secret/ConfigMap data (a missing optional one is skipped)
  volumeMounts          -v SOURCE:PATH[:ro] (subPath mounts the one file), where a volume's
                        source is made here: a Secret or ConfigMap as a directory of files
                        (defaultMode; with fsGroup, owned root:fsGroup and group-readable,
                        as the kubelet does), a volumeClaimTemplate as a host directory
                        owned by fsGroup that outlives the container, an emptyDir as tmpfs
  securityContext       --user runAsUser:runAsGroup, --group-add fsGroup, --read-only (and
                        no writable tmpfs but the manifest's emptyDirs),
                        --security-opt no-new-privileges, --cap-drop for capabilities.drop
  terminationGrace...   --stop-timeout (podman stop: SIGTERM, then SIGKILL after it)
  Service names         --add-host NAME:ADDRESS for the short and cluster-local names the
                        test maps to its hosts

What a kubelet does and this does not: resource limits (cgroup v1 hybrid here), probes
(the test polls the manifest's readinessProbe itself, `readiness_url`), restarts, image pulls.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

NAMESPACE_DOMAIN = "zstalk.svc.cluster.local"


@dataclass
class Workload:
    kind: str
    name: str
    pod: dict                   # spec.template.spec
    claims: list[str]           # a StatefulSet's volumeClaimTemplates names

    @property
    def container(self) -> dict:
        return self.pod["containers"][0]

    @property
    def grace_s(self) -> int:
        return int(self.pod.get("terminationGracePeriodSeconds", 30))

    def port(self, name_or_number) -> int:
        if isinstance(name_or_number, int) or str(name_or_number).isdigit():
            return int(name_or_number)
        return next(p["containerPort"] for p in self.container.get("ports", ())
                    if p.get("name") == name_or_number)

    def readiness_url(self, address: str) -> str | None:
        """The readinessProbe's httpGet as a URL on `address`, or None without one."""
        get = (self.container.get("readinessProbe") or {}).get("httpGet")
        if get is None:
            return None
        return f"http://{address}:{self.port(get['port'])}{get.get('path', '/')}"

    def run_argv(self, image: str, *, network: str, container_name: str,
                 services: dict[str, str], data: "PodData") -> list[str]:
        c, pod = self.container, self.pod
        argv = ["run", "-d", "--name", container_name, "--network", network,
                "--stop-timeout", str(self.grace_s), "--entrypoint", json.dumps(c["command"])]
        argv += _security(pod.get("securityContext", {}), c.get("securityContext", {}))
        for name, address in services.items():
            argv += ["--add-host", f"{name}:{address}",
                     "--add-host", f"{name}.{NAMESPACE_DOMAIN}:{address}"]
        for var in c.get("env", ()):
            value = _env_value(var, data)
            if value is not None:
                argv += ["-e", f"{var['name']}={value}"]
        volumes = {v["name"]: v for v in pod.get("volumes", ())}
        fs_group = pod.get("securityContext", {}).get("fsGroup")
        for mount in c.get("volumeMounts", ()):
            argv += _mount(mount, volumes.get(mount["name"]), self, data, fs_group)
        return argv + [image, *c.get("args", ())]


@dataclass
class PodData:
    """What the cluster would hold: Secret and ConfigMap data, and claim directories."""
    root: Path                                  # where volumes are materialised
    secrets: dict[str, dict[str, bytes]]
    config_maps: dict[str, dict[str, str]]

    def claim(self, workload: str, name: str) -> Path:
        """A volumeClaimTemplate's volume for the workload's pod 0 (kept across restarts)."""
        return self.root / "claims" / f"{name}-{workload}-0"


def workloads(objects: Iterable[dict]) -> dict[str, Workload]:
    found = {}
    for obj in objects:
        if obj.get("kind") in ("Deployment", "StatefulSet"):
            claims = [t["metadata"]["name"] for t in obj["spec"].get("volumeClaimTemplates", ())]
            found[obj["metadata"]["name"]] = Workload(obj["kind"], obj["metadata"]["name"],
                                                      obj["spec"]["template"]["spec"], claims)
    return found


def config_maps(objects: Iterable[dict]) -> dict[str, dict[str, str]]:
    return {o["metadata"]["name"]: o.get("data", {}) for o in objects if o.get("kind") == "ConfigMap"}


def _security(pod_ctx: dict, ctx: dict) -> list[str]:
    argv = []
    user = ctx.get("runAsUser", pod_ctx.get("runAsUser"))
    group = ctx.get("runAsGroup", pod_ctx.get("runAsGroup"))
    if user is not None:
        argv += ["--user", f"{user}:{group}" if group is not None else str(user)]
    if pod_ctx.get("fsGroup") is not None:
        argv += ["--group-add", str(pod_ctx["fsGroup"])]
    if ctx.get("readOnlyRootFilesystem"):     # and no tmpfs of podman's own on /run, /var/tmp
        argv += ["--read-only", "--read-only-tmpfs=false"]
    if ctx.get("allowPrivilegeEscalation") is False:
        argv += ["--security-opt", "no-new-privileges"]
    for cap in ctx.get("capabilities", {}).get("drop", ()):
        argv += ["--cap-drop", cap]
    return argv


def _env_value(var: dict, data: PodData) -> str | None:
    if "value" in var:
        return var["value"]
    source = var.get("valueFrom", {})
    for key, store in (("secretKeyRef", data.secrets), ("configMapKeyRef", data.config_maps)):
        ref = source.get(key)
        if ref is not None:
            value = store.get(ref["name"], {}).get(ref["key"])
            if value is None:
                if ref.get("optional"):
                    return None
                raise KeyError(f"env {var['name']}: {key} {ref['name']}/{ref['key']} is not given")
            return value.decode() if isinstance(value, bytes) else value
    raise ValueError(f"env {var['name']}: unsupported source {source}")


def _mount(mount: dict, volume: dict | None, workload: Workload, data: PodData,
           fs_group: int | None) -> list[str]:
    path, ro = mount["mountPath"], ":ro" if mount.get("readOnly") else ""
    name = mount["name"]
    if volume is None and name in workload.claims:
        source = data.claim(workload.name, name)
        if not source.exists():
            source.mkdir(parents=True)
            if fs_group is not None:
                os.chown(source, 0, fs_group)
                source.chmod(0o2775)
        return ["-v", f"{source}:{path}{ro}"]
    if volume is None:
        raise KeyError(f"{workload.name}: volumeMount {name} has no volume")
    if "emptyDir" in volume:
        return ["--mount", f"type=tmpfs,destination={path},tmpfs-mode=1777"]
    if "secret" in volume:
        files, mode = data.secrets[volume["secret"]["secretName"]], volume["secret"].get("defaultMode", 0o644)
    elif "configMap" in volume:
        files, mode = data.config_maps[volume["configMap"]["name"]], volume["configMap"].get("defaultMode", 0o644)
    else:
        raise ValueError(f"{workload.name}: unsupported volume {volume}")
    source = _materialise(data.root / "volumes" / workload.name / name, files, mode, fs_group)
    if "subPath" in mount:
        source = source / mount["subPath"]
    return ["-v", f"{source}:{path}{ro}"]


def _materialise(directory: Path, files: dict, mode: int, fs_group: int | None) -> Path:
    """A Secret or ConfigMap volume: one file per key, as the kubelet writes it."""
    directory.mkdir(parents=True, exist_ok=True)
    if fs_group is not None:        # fsGroup: group-owned, and the group gets the owner's read
        mode |= (mode & 0o400) >> 3
    for key, value in files.items():
        target = directory / key
        target.write_bytes(value if isinstance(value, bytes) else value.encode())
        if fs_group is not None:
            os.chown(target, 0, fs_group)
        target.chmod(mode)
    directory.chmod(0o755)
    return directory
