"""A kubelet stand-in for the emulator's one node.

The operator's end-to-end tests (and `cadence dev cluster`) must run the pods it writes,
so that a wrong command, port, environment variable, volume, probe or grace period fails
a test. No container runtime runs here, so the stand-in runs each pod's first container
as a local process, as close to a kubelet as Linux namespaces allow
(it needs root, as a kubelet does):

- network: each pod has its own network namespace and IP on a bridge, so it listens on
  its containerPorts as written, and the host (the operator) reaches it at
  `status.podIP`; `/etc/hosts` (bind-mounted into the pod) gives every Service's DNS
  names (`svc`, `svc.ns`, `svc.ns.svc`, `svc.ns.svc.cluster.local`, and for a headless
  Service each pod's `hostname.subdomain.ns.svc...`) the IPs of its ready pods;
- volumes: emptyDir a fresh directory, configMap its keys as files, a claim a directory
  per claim (or the one `claims` names), each bind-mounted at its mountPath in the pod's
  own mount namespace (read-only where the mount says so);
- the command: `command`, else the image's entrypoint, the installed `cadence` (images
  are not pulled: every pod runs this checkout), with the image's environment
  (Containerfile) and the container's `env`: values, Secret and ConfigMap keys
  (missing: the pod waits, CreateContainerConfigError) and the downward API fields;
- probes: readiness (httpGet, tcpSocket) at least once a second, liveness at its period
  after its initial delay; Ready follows readiness; liveness failing its threshold
  restarts the process;
- lifecycle: a process that exits is started again (restartPolicy Always) after a
  back-off, counted in `restartCount` with its exit code; a pod admitted is bound to
  the node (`spec.nodeName`), so deleting it marks it Terminating; it then gets
  SIGTERM, SIGKILL after its `terminationGracePeriodSeconds`, and once its process
  has ended its object is deleted for good;
- StatefulSets: pods `NAME-i` from the template, with claims from its templates; pods
  beyond `replicas` deleted (a finished run's trainer scaled to 0).

What it does not do: resource limits, security contexts (the processes run as root),
image pulls, startup probes, node selection. The operator runs outside the pod network,
as it would with `--server`: `transport()` resolves Service names for its clients as
cluster DNS would.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import itertools
import os
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from cadence.operator.local.processes import CADENCE

from .emulator import ApiError, call

_instances = itertools.count()
PROBE_EVERY_S = 1.0  # the shortest probe period here


@dataclass
class Container:
    """One pod's process and what the kubelet knows of it."""

    name: str
    namespace: str
    uid: str
    ip: str
    netns: str
    veth: str
    dirs: list[Path]
    spec: dict[str, Any]
    grace_s: float
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    last_exit: int | None = None
    next_start: float = 0.0
    ready: bool = False
    readiness_failures: int = 0
    liveness_failures: int = 0
    probed: dict[str, float] = field(default_factory=dict)
    started: float = 0.0  # when its process last started
    said: dict[str, Any] | None = None  # the status last written


class Kubelet(threading.Thread):
    def __init__(self, url: str, workdir: Path, *, claims: dict[str, Path] | None = None) -> None:
        super().__init__(daemon=True)
        self.url, self.workdir = url, workdir
        self.claims = dict(claims or {})
        n = next(_instances) % 200 + os.getpid() % 50
        self.tag = f"ck{n}"
        self.subnet = f"10.{200 + n % 50}.{n % 250}"
        self.bridge = f"{self.tag}br"
        self.node_name = f"node-{self.tag}"
        self.hosts = workdir / "hosts"
        self.pods: dict[str, Container] = {}  # by uid
        self.terminating: dict[str, Container] = {}  # deleted, in their grace period
        self.free_ips = [f"{self.subnet}.{i}" for i in range(2, 250)]
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.mountpoints: set[Path] = set()
        self.http = httpx.Client(timeout=2.0)
        # Pods deleted and their processes ended: name -> (how, exit code); how is
        # "exited" (on its own after SIGTERM, within its grace) or "killed".
        self.ended: dict[str, tuple[str, int | None]] = {}

    # --- the node ---

    def __enter__(self) -> Kubelet:
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        self.hosts.write_text("127.0.0.1 localhost\n")
        _sh(f"ip link add {self.bridge} type bridge")
        _sh(f"ip addr add {self.subnet}.1/24 dev {self.bridge}")
        _sh(f"ip link set {self.bridge} up")
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.join(timeout=60)
        for c in [*self.pods.values(), *self.terminating.values()]:
            self._kill(c)  # the node goes: pods in their grace period too
        for c in list(self.terminating.values()):
            self._release(c)
        with contextlib.suppress(subprocess.CalledProcessError):
            _sh(f"ip link del {self.bridge}")
        for path in sorted(self.mountpoints, key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                path.rmdir()  # only the empty mountpoints this node made
        self.http.close()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self._statefulsets()
                self._sync()
            except (ApiError, OSError):
                # The emulator going away as a test ends, or one call to it timing out
                # on a busy machine: the node tries again next turn rather than die.
                pass
            except BaseException as e:
                self.errors.append(e)
                raise
            self.stop.wait(0.1)

    def serving(self, pod: str, port: int, path: str = "/healthz") -> bool:
        """Whether `pod`'s process answers on `port` (what it listens on, whatever its
        spec says)."""
        for c in list(self.pods.values()):
            if c.name == pod:
                with contextlib.suppress(httpx.HTTPError):
                    return self.http.get(f"http://{c.ip}:{port}{path}").status_code < 400
        return False

    def readiness_failures(self, pod: str) -> int:
        return sum(c.readiness_failures for c in list(self.pods.values()) if c.name == pod)

    def log(self, pod: str) -> str:
        path = self.workdir / "logs" / f"{pod}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def transport(self) -> httpx.AsyncBaseTransport:
        """An httpx transport that resolves the node's Service and pod names at each
        request, as cluster DNS does for a client in the cluster (the operator here)."""
        node = self

        class Resolving(httpx.AsyncHTTPTransport):
            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                ip = node._names().get(request.url.host)
                if ip is not None:
                    request.url = request.url.copy_with(host=ip)
                return await super().handle_async_request(request)

        return Resolving()

    def url_of(self, url: str) -> str:
        """`url` with a Service's (or pod's) DNS name replaced by its IP, as cluster DNS
        answers a client in the cluster."""
        parts = urllib.parse.urlsplit(url)
        names = self._names()
        ip = names.get(parts.hostname or "", parts.hostname)
        return parts._replace(netloc=f"{ip}:{parts.port}" if parts.port else str(ip)).geturl()

    # --- what the API says should run ---

    def _list(self, path: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = call(self.url, "GET", path)["items"]
        return items

    def _statefulsets(self) -> None:
        """kube-controller-manager's StatefulSet controller, for `replicas` pods: the
        missing made, those beyond `replicas` deleted."""
        pods = self._list("/api/v1/pods")
        for sts in self._list("/apis/apps/v1/statefulsets"):
            meta, spec = sts["metadata"], sts["spec"]
            ns = meta["namespace"]
            for pod in pods:
                owners = pod["metadata"].get("ownerReferences") or []
                index = pod["metadata"]["name"].rpartition("-")[2]
                if any(o.get("uid") == meta["uid"] for o in owners) and (
                    index.isdigit() and int(index) >= spec.get("replicas", 1)
                ):
                    with contextlib.suppress(ApiError):
                        call(
                            self.url,
                            "DELETE",
                            f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}",
                        )
            for i in range(spec.get("replicas", 1)):
                name = f"{meta['name']}-{i}"
                with contextlib.suppress(ApiError):
                    call(self.url, "GET", f"/api/v1/namespaces/{ns}/pods/{name}")
                    continue
                template = copy.deepcopy(spec["template"])
                pod_spec = template["spec"]
                pod_spec.update(hostname=name, subdomain=spec.get("serviceName"))
                for claim in spec.get("volumeClaimTemplates", []):
                    claim_name = f"{claim['metadata']['name']}-{name}"
                    pod_spec.setdefault("volumes", []).append(
                        {
                            "name": claim["metadata"]["name"],
                            "persistentVolumeClaim": {"claimName": claim_name},
                        }
                    )
                owner = {
                    "apiVersion": "apps/v1",
                    "kind": "StatefulSet",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                }
                pod = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": name,
                        "namespace": ns,
                        "labels": template.get("metadata", {}).get("labels", {}),
                        "ownerReferences": [owner],
                    },
                    "spec": pod_spec,
                }
                with contextlib.suppress(ApiError):
                    call(self.url, "POST", f"/api/v1/namespaces/{ns}/pods", pod)

    def _sync(self) -> None:
        pods = {p["metadata"]["uid"]: p for p in self._list("/api/v1/pods")}
        for uid, c in list(self.pods.items()):
            pod = pods.get(uid)
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                self._terminate(c)
        for uid, pod in pods.items():
            if uid not in self.pods and not pod["metadata"].get("deletionTimestamp"):
                self._admit(pod)
        self._write_hosts(pods)
        now = time.monotonic()
        for c in list(self.pods.values()):
            self._tend(c, now)
            self._report(c)

    # --- a pod's life ---

    def _admit(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        # Bound to this node, as the scheduler would: a delete is graceful from now on.
        with contextlib.suppress(ApiError):
            call(
                self.url,
                "PATCH",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                {"spec": {"nodeName": self.node_name}},
            )
        index = len(self.free_ips)
        ip = self.free_ips.pop(0)
        netns, veth = f"{self.tag}p{index}", f"{self.tag}v{index}"
        _sh(f"ip netns add {netns}")
        _sh(f"ip link add {veth} type veth peer name {veth}c")
        _sh(f"ip link set {veth}c netns {netns}")
        _sh(f"ip link set {veth} master {self.bridge} up")
        _sh(f"ip netns exec {netns} ip addr add {ip}/24 dev {veth}c")
        _sh(f"ip netns exec {netns} ip link set {veth}c up")
        _sh(f"ip netns exec {netns} ip link set lo up")
        _sh(f"ip netns exec {netns} ip route add default via {self.subnet}.1")
        c = Container(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta["uid"],
            ip=ip,
            netns=netns,
            veth=veth,
            dirs=[],
            spec=pod["spec"],
            grace_s=float(pod["spec"].get("terminationGracePeriodSeconds", 30)),
        )
        self.pods[c.uid] = c

    def _tend(self, c: Container, now: float) -> None:
        if c.proc is not None and c.proc.poll() is not None:
            c.last_exit = c.proc.returncode
            c.proc, c.ready = None, False
            c.restarts += 1
            c.next_start = now + min(10.0, 0.5 * 2 ** min(c.restarts, 5))
        if c.proc is None and now >= c.next_start:
            self._start(c)
        if c.proc is None:
            return
        main = c.spec["containers"][0]
        readiness = main.get("readinessProbe")
        if readiness and self._due(c, "readiness", readiness, now):
            ok = self._probe(c, readiness)
            c.ready = ok
            c.readiness_failures += 0 if ok else 1
        elif not readiness:
            c.ready = True
        liveness = main.get("livenessProbe")
        if liveness and self._due(c, "liveness", liveness, now):
            if self._probe(c, liveness):
                c.liveness_failures = 0
            else:
                c.liveness_failures += 1
                if c.liveness_failures >= liveness.get("failureThreshold", 3):
                    c.liveness_failures = 0
                    self._signal(c, signal.SIGKILL)

    def _due(self, c: Container, kind: str, probe: dict[str, Any], now: float) -> bool:
        # Readiness is asked more often than its period (tests wait on it); liveness at
        # its own period, so its threshold times its period is the grace it gives.
        period = float(probe.get("periodSeconds", 10))
        if kind == "readiness":
            period = min(period, PROBE_EVERY_S)
        if now - c.started < float(probe.get("initialDelaySeconds", 0)):
            return False
        if now - c.probed.get(kind, c.started - period) < period:
            return False
        c.probed[kind] = now
        return True

    def _port(self, c: Container, port: int | str) -> int:
        if isinstance(port, int):
            return port
        for p in c.spec["containers"][0].get("ports", []):
            if p.get("name") == port:
                return int(p["containerPort"])
        raise LookupError(f"pod {c.name} has no port named {port!r}")

    def _probe(self, c: Container, probe: dict[str, Any]) -> bool:
        try:
            if "httpGet" in probe:
                get = probe["httpGet"]
                url = f"http://{c.ip}:{self._port(c, get['port'])}{get.get('path', '/')}"
                return 200 <= self.http.get(url).status_code < 400
            if "tcpSocket" in probe:
                port = self._port(c, probe["tcpSocket"]["port"])
                with socket.create_connection((c.ip, port), timeout=1.0):
                    return True
        except (httpx.HTTPError, OSError, LookupError):
            return False
        return False

    def _start(self, c: Container) -> None:
        main = c.spec["containers"][0]
        env = self._env(c, main)
        if env is None:
            c.next_start = time.monotonic() + 1.0
            return  # CreateContainerConfigError: tried again
        home = self._dir(c, "home")
        mounts = [("/etc/hosts", self.hosts, True)]
        volumes = {v["name"]: v for v in c.spec.get("volumes", [])}
        for mount in main.get("volumeMounts", []):
            source = self._volume(c, volumes[mount["name"]])
            mounts.append((mount["mountPath"], source, bool(mount.get("readOnly"))))
        script = []
        for target, source, read_only in mounts:
            path = Path(target)
            if not path.exists():
                path.mkdir(parents=True)
                self.mountpoints.add(path)
            script.append(f"mount --bind {shlex.quote(str(source))} {shlex.quote(target)}")
            if read_only:
                script.append(f"mount -o remount,bind,ro {shlex.quote(target)}")
        command = main.get("command") or CADENCE
        argv = [*command, *main.get("args", [])]
        image_env = {
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        }
        c.started = time.monotonic()
        c.probed.clear()
        log = (self.workdir / "logs" / f"{c.name}.log").open("ab")
        c.proc = subprocess.Popen(
            [
                *("ip", "netns", "exec", c.netns),
                *("unshare", "--mount", "--propagation", "private"),
                *("sh", "-c", "; ".join([*script, 'exec "$@"']), "pod"),
                *argv,
            ],
            env={**image_env, **env},
            cwd=home,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def _env(self, c: Container, main: dict[str, Any]) -> dict[str, str] | None:
        out: dict[str, str] = {}
        for item in main.get("env", []):
            if "value" in item:
                out[item["name"]] = str(item["value"])
                continue
            source = item.get("valueFrom", {})
            value: str | None = None
            if "secretKeyRef" in source or "configMapKeyRef" in source:
                secret = "secretKeyRef" in source
                ref = source["secretKeyRef" if secret else "configMapKeyRef"]
                kind = "secrets" if secret else "configmaps"
                try:
                    obj = call(
                        self.url, "GET", f"/api/v1/namespaces/{c.namespace}/{kind}/{ref['name']}"
                    )
                except ApiError:
                    return None
                raw = (obj.get("data") or {}).get(ref["key"])
                if raw is None:
                    return None
                value = base64.b64decode(raw).decode() if secret else raw
            elif "fieldRef" in source:
                value = {
                    "metadata.name": c.name,
                    "metadata.namespace": c.namespace,
                    "status.podIP": c.ip,
                }.get(source["fieldRef"]["fieldPath"])
            if value is None:
                return None
            out[item["name"]] = value
        return out

    def _dir(self, c: Container, name: str) -> Path:
        path = self.workdir / "pods" / c.name / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _volume(self, c: Container, volume: dict[str, Any]) -> Path:
        if "emptyDir" in volume:
            return self._dir(c, f"empty-{volume['name']}")
        if "configMap" in volume:
            obj = call(
                self.url,
                "GET",
                f"/api/v1/namespaces/{c.namespace}/configmaps/{volume['configMap']['name']}",
            )
            path = self._dir(c, f"configmap-{volume['name']}")
            for key, text in (obj.get("data") or {}).items():
                (path / key).write_text(text)
            return path
        if "persistentVolumeClaim" in volume:
            claim: str = volume["persistentVolumeClaim"]["claimName"]
            if claim in self.claims:
                return self.claims[claim]
            path = self.workdir / "claims" / claim
            path.mkdir(parents=True, exist_ok=True)
            return path
        raise ValueError(f"pod {c.name}: volume {volume['name']} of a kind this node lacks")

    def _signal(self, c: Container, sig: int) -> None:
        if c.proc is not None and c.proc.poll() is None:
            c.proc.send_signal(sig)

    def _terminate(self, c: Container) -> None:
        """SIGTERM, then SIGKILL after the grace period, in the background; the pod's
        IP and namespace go once its process has."""
        del self.pods[c.uid]
        self.terminating[c.uid] = c
        proc = c.proc

        def finish() -> None:
            how = "exited"
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=c.grace_s)
                except subprocess.TimeoutExpired:
                    how = "killed"
                    proc.kill()
                    proc.wait()
            self.ended[c.name] = (how, None if proc is None else proc.returncode)
            self._teardown(c)
            self._release(c)
            self.terminating.pop(c.uid, None)

        threading.Thread(target=finish, daemon=True).start()

    def _release(self, c: Container) -> None:
        """The pod's process has ended: delete its object for good (grace 0), as a
        kubelet does, so its name is free for a replacement."""
        pod = f"/api/v1/namespaces/{c.namespace}/pods/{c.name}"
        with contextlib.suppress(ApiError, OSError):
            if call(self.url, "GET", pod)["metadata"]["uid"] == c.uid:
                call(self.url, "DELETE", f"{pod}?gracePeriodSeconds=0")

    def _kill(self, c: Container) -> None:
        self.pods.pop(c.uid, None)
        if c.proc is not None and c.proc.poll() is None:
            c.proc.kill()
            c.proc.wait()
        self._teardown(c)

    def _teardown(self, c: Container) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            _sh(f"ip netns del {c.netns}")
        with contextlib.suppress(subprocess.CalledProcessError):
            _sh(f"ip link del {c.veth}")
        shutil.rmtree(self.workdir / "pods" / c.name, ignore_errors=True)

    # --- what the API and the pods see of it ---

    def _report(self, c: Container) -> None:
        running = c.proc is not None
        state: dict[str, Any] = (
            {"running": {}}
            if running
            else {"waiting": {"reason": "CrashLoopBackOff" if c.restarts else "ContainerCreating"}}
        )
        status: dict[str, Any] = {
            "phase": "Running" if running else "Pending",
            "podIP": c.ip,
            "hostIP": f"{self.subnet}.1",
            "conditions": [{"type": "Ready", "status": "True" if c.ready and running else "False"}],
            "containerStatuses": [
                {
                    "name": c.spec["containers"][0]["name"],
                    "ready": c.ready and running,
                    "restartCount": c.restarts,
                    "state": state,
                    **(
                        {"lastState": {"terminated": {"exitCode": c.last_exit}}}
                        if c.last_exit is not None
                        else {}
                    ),
                }
            ],
        }
        if status == c.said:
            return
        with contextlib.suppress(ApiError):
            call(
                self.url,
                "PATCH",
                f"/api/v1/namespaces/{c.namespace}/pods/{c.name}/status",
                {"status": status},
            )
            c.said = status

    def _names(self) -> dict[str, str]:
        names: dict[str, str] = {}
        ready = {c.uid: c for c in list(self.pods.values()) if c.ready}
        for svc in self._list("/api/v1/services"):
            meta, spec = svc["metadata"], svc.get("spec") or {}
            ns, name = meta["namespace"], meta["name"]
            selector = spec.get("selector") or {}
            members = [
                (p, ready[p["metadata"]["uid"]])
                for p in self._list(f"/api/v1/namespaces/{ns}/pods")
                if p["metadata"]["uid"] in ready
                and selector.items() <= (p["metadata"].get("labels") or {}).items()
            ]
            for pod, c in members:
                for host in (
                    name,
                    f"{name}.{ns}",
                    f"{name}.{ns}.svc",
                    f"{name}.{ns}.svc.cluster.local",
                ):
                    names.setdefault(host, c.ip)
                hostname, subdomain = pod["spec"].get("hostname"), pod["spec"].get("subdomain")
                if hostname and subdomain == name:
                    for suffix in (f"{ns}.svc", f"{ns}.svc.cluster.local"):
                        names[f"{hostname}.{name}.{suffix}"] = c.ip
        return names

    def _write_hosts(self, _: dict[str, dict[str, Any]]) -> None:
        lines = ["127.0.0.1 localhost"]
        lines += [f"{ip} {host}" for host, ip in sorted(self._names().items())]
        text = "\n".join(lines) + "\n"
        if self.hosts.read_text() != text:
            with self.hosts.open("r+") as f:  # the same inode: it is bind-mounted
                f.seek(0)
                f.truncate()
                f.write(text)


def _sh(command: str) -> None:
    subprocess.run(command.split(), check=True, capture_output=True)


def available() -> bool:
    """Whether this machine lets a test make network and mount namespaces (root, iproute2)."""
    return (
        os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("unshare") is not None
    )
