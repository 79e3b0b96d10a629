"""A lab of real hosts on one machine: Linux network and UTS namespaces joined by a bridge.

Each host has its own hostname, network stack and ``lab0`` interface, one end of a veth pair
whose other end is a port of a bridge. The bridge lives in the lab's *head* namespace, where
``mpiexec`` runs (like a login node). Every lab has its own namespaces, so all labs use the same
subnet (hosts ``10.213.0.1``..., the head ``10.213.0.254``) and never see each other or the
machine's own network. hydra reaches the hosts through its ssh launcher pointed at a generated
script that enters the host's namespaces instead of logging in. Needs root, ``ip``, ``nsenter``,
``unshare`` (and ``tc`` for ``rate=``); :func:`available` says what is missing.

    with Lab(hosts=2, rate="2gbit") as lab:
        cmd, env = lab.mpiexec(["python", "train.py"], hosts=2, ranks_per_host=2)
        subprocess.run(cmd, env=env)

    python benchmarks/lab.py up -n 2 --rate 2gbit      # prints the lab's name, e.g. clab-3fa2b1
    python benchmarks/lab.py run clab-3fa2b1 -ppn 2 -- python train.py
    python benchmarks/lab.py exec clab-3fa2b1 h1 -- ip addr
    python benchmarks/lab.py down clab-3fa2b1          # or: down --all (every lab, leftovers too)

A lab made by :class:`Lab` is torn down when its ``with`` block ends, at interpreter exit, and
on SIGTERM/SIGHUP; one left by a killed process is removed by the next :class:`Lab` (its owner
is gone) or by ``down --all``. Labs made with ``up`` stay until ``down``.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

STATE = Path("/run/collectives-lab")  # one folder per lab: lab.json, the launcher, UTS files
NETNS = Path("/run/netns")            # where `ip netns` keeps network namespaces
PREFIX = "clab-"
IFACE = "lab0"                        # every host's interface, and the head's bridge
SUBNET = "10.213.0"
HEAD_ADDRESS = f"{SUBNET}.254"
# MPICH's network module, TCP only, on the lab interface. Without UCX_TLS=tcp, UCX sees that all
# "hosts" share one kernel and moves their traffic through shared memory (sysv, cma), never over
# the links; FI_PROVIDER=tcp keeps libfabric off its shm provider likewise. Ranks on one host
# still use MPICH's own shared memory, as on a real node.
NETWORK_ENV = {
    "ucx": {"MPIR_CVAR_CH4_NETMOD": "ucx", "UCX_TLS": "tcp", "UCX_NET_DEVICES": IFACE},
    "ofi": {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": IFACE},
}
MPI_DAEMONS = ("hydra_pmi_proxy", "prted")  # what a launcher starts on each host
_SSH_OPTIONS_WITH_VALUE = "bcDEeFIiJLlmOopQRSWw"
_LAUNCHER = """#!/bin/sh
# MPI launchers call this as they call ssh: `ssh [options] HOST COMMAND`, COMMAND a shell command
# line. It runs COMMAND with sh in HOST's namespaces (`ip netns exec` also mounts that namespace's
# own /sys), in this process's environment.
while [ $# -gt 0 ]; do
  case $1 in
    -[{with_value}]) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=$1; shift
case $host in
{cases}
  *) echo "lab {name}: no host named '$host'" >&2; exit 255 ;;
esac
exec {nsenter} --uts={state}/$host.uts -- {ip} netns exec {name}-$host sh -c "$*"
"""


def _run(*argv: str) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"lab: `{shlex.join(argv)}` failed: {proc.stderr.strip()}")
    return proc.stdout


def tool(name: str) -> str:
    """The path of a system tool (``ip``, ``tc``, ...): on ``PATH``, else in the sbin folders
    a non-login shell's ``PATH`` leaves out."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin") or name


@functools.lru_cache(maxsize=1)
def available() -> str | None:
    """None where a lab can be made here, else the reason it cannot (tests skip with it)."""
    if not sys.platform.startswith("linux"):
        return "the lab needs Linux network namespaces"
    if os.geteuid() != 0:
        return "the lab needs root (it creates network namespaces, veth pairs and a bridge)"
    missing = [t for t in ("ip", "nsenter", "unshare", "tc") if shutil.which(tool(t)) is None]
    if missing:
        return f"the lab needs {', '.join(missing)} (iproute2, util-linux)"
    probe = ("ip link add name pa type veth peer name pb && ip link add name pbr type bridge && "
             "ip link set pa master pbr && mount -t sysfs none /sys && hostname probe")
    proc = subprocess.run([tool("unshare"), "--net", "--uts", "--mount", "--propagation",
                           "private", "sh", "-c", probe], capture_output=True, text=True)
    if proc.returncode != 0:
        return f"namespaces, veth or bridges are not usable here: {proc.stderr.strip()}"
    return None


def parse_rate(rate: str) -> float:
    """``tc``'s rate syntax (``2gbit``, ``500mbit``, ``100kbit``, ``1000bit``) in bits per second."""
    text = rate.strip().lower()
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if text.endswith(unit):
            try:
                return float(text[:-len(unit)]) * scale
            except ValueError:
                break
    raise ValueError(f"rate={rate!r}: write it as tc does, e.g. '2gbit', '500mbit'")


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class Host:
    """One host: its name (the hostname inside it, and what hydra is given), its address on
    the lab subnet, its network namespace and its port on the head's bridge."""

    def __init__(self, lab: str, index: int):
        self.index, self.name = index, f"h{index}"
        self.address = f"{SUBNET}.{index + 1}"
        self.netns, self.port = f"{lab}-{self.name}", self.name

    def __repr__(self) -> str:
        return f"Host({self.name}, {self.address})"


class Lab:
    """``hosts`` hosts on one bridge, each link shaped to ``rate`` (tc syntax) both ways when
    given. ``persistent=True`` (the ``up`` command) leaves it standing until :meth:`down`."""

    def __init__(self, hosts: int = 2, *, rate: str | None = None, name: str | None = None,
                 persistent: bool = False):
        if not 1 <= hosts <= 253:
            raise ValueError(f"hosts={hosts}: a lab has 1 to 253 hosts")
        if rate is not None:
            parse_rate(rate)
        self.name = name or PREFIX + secrets.token_hex(3)
        if not re.fullmatch(PREFIX + r"[a-z0-9]+", self.name):
            raise ValueError(f"name={name!r}: a lab's name is {PREFIX!r} then letters and digits")
        self.hosts = [Host(self.name, i) for i in range(hosts)]
        self.rate, self.persistent = rate, persistent
        self.head = f"{self.name}-head"
        self.state = STATE / self.name
        self.launcher = self.state / "launch"
        self.owner = None if persistent else (os.getpid(), _start_time(os.getpid()))
        self._up = False

    # --- life cycle -------------------------------------------------------------------------

    def up(self) -> Lab:
        """Build the lab (after removing labs whose owner died); returns it."""
        reason = available()
        if reason:
            raise RuntimeError(f"lab: {reason}")
        if not self.persistent:
            cleanup(stale_only=True)
        STATE.mkdir(parents=True, exist_ok=True)
        try:
            self.state.mkdir()  # atomic: two labs never share a name
        except FileExistsError:
            raise ValueError(f"a lab named {self.name} exists: pick another name, or remove it "
                             f"with `python benchmarks/lab.py down {self.name}`") from None
        self._save()
        self._up = True
        if self.owner:
            _OWNED[self.name] = self
            _install_handlers()
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _build(self) -> None:
        ip = tool("ip")
        _run(ip, "netns", "add", self.head)
        _run(ip, "-n", self.head, "link", "add", IFACE, "type", "bridge")
        _run(ip, "-n", self.head, "addr", "add", f"{HEAD_ADDRESS}/24", "dev", IFACE)
        for dev in ("lo", IFACE):
            _run(ip, "-n", self.head, "link", "set", dev, "up")
        for h in self.hosts:
            _run(ip, "netns", "add", h.netns)
            _run(ip, "-n", h.netns, "link", "add", IFACE, "type", "veth", "peer", "name", h.port,
                 "netns", self.head)
            _run(ip, "-n", self.head, "link", "set", h.port, "master", IFACE, "up")
            _run(ip, "-n", h.netns, "addr", "add", f"{h.address}/24", "dev", IFACE)
            for dev in ("lo", IFACE):
                _run(ip, "-n", h.netns, "link", "set", dev, "up")
            uts = self.state / f"{h.name}.uts"
            uts.touch()
            _run(tool("unshare"), f"--uts={uts}", "hostname", h.name)
            if self.rate:
                self.set_rate(h, self.rate)
        cases = "\n".join(f"  {h.name}) ;;" for h in self.hosts)
        self.launcher.write_text(_LAUNCHER.format(
            with_value=_SSH_OPTIONS_WITH_VALUE, cases=cases, name=self.name, state=self.state,
            nsenter=tool("nsenter"), ip=tool("ip")))
        self.launcher.chmod(0o755)

    def down(self) -> None:
        """Kill every process in the lab, delete its namespaces (the veth pairs go with them)
        and its folder. Safe to call twice and on a half-built lab."""
        _OWNED.pop(self.name, None)
        _remove(self.name, [self.head] + [h.netns for h in self.hosts])
        self._up = False

    def __enter__(self) -> Lab:
        return self if self._up else self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def _save(self) -> None:
        data = {"hosts": len(self.hosts), "rate": self.rate, "owner": self.owner}
        (self.state / "lab.json").write_text(json.dumps(data))

    @classmethod
    def load(cls, name: str) -> Lab:
        """A lab made earlier (by ``up``, or by another process)."""
        try:
            data = json.loads((STATE / name / "lab.json").read_text())
        except OSError:
            raise ValueError(f"no lab named {name!r} (python benchmarks/lab.py list)") from None
        lab = cls(data["hosts"], rate=data["rate"], name=name, persistent=True)
        lab.owner, lab._up = data["owner"], True
        return lab

    # --- running things ---------------------------------------------------------------------

    def host(self, which: int | str | Host) -> Host:
        if isinstance(which, Host):
            return which
        for h in self.hosts:
            if which in (h.index, h.name):
                return h
        raise ValueError(f"lab {self.name} has no host {which!r}; it has "
                         f"{', '.join(h.name for h in self.hosts)}")

    def on_host(self, which: int | str | Host, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` on a host, as the launcher does."""
        return [str(self.launcher), self.host(which).name, shlex.join(argv)]

    def on_head(self, argv: Sequence[str]) -> list[str]:
        return [tool("nsenter"), f"--net={NETNS / self.head}", "--", *argv]

    def mpiexec(self, argv: Sequence[str], *, hosts: int | None = None, ranks_per_host: int = 1,
                flags: Sequence[str] = (), env: Mapping[str, str] | None = None,
                netmod: str = "ucx", mpiexec: str | None = None) -> tuple[list[str], dict[str, str]]:
        """The command line and environment that run ``argv`` as ``hosts`` (default: all)
        x ``ranks_per_host`` ranks under MPICH's hydra, started from the head.

        The environment is this process's, less ``COLLECTIVES_RANKS_PER_NODE`` (the lab's nodes
        are real), plus :data:`NETWORK_ENV` of MPICH's ``netmod`` (``"ucx"`` or ``"ofi"``, both
        over TCP on ``lab0``), plus ``env``. ``flags`` go to mpiexec.
        """
        if netmod not in NETWORK_ENV:
            raise ValueError(f"netmod={netmod!r}: MPICH's network modules are {sorted(NETWORK_ENV)}")
        hosts = len(self.hosts) if hosts is None else hosts
        if not 1 <= hosts <= len(self.hosts):
            raise ValueError(f"hosts={hosts}: lab {self.name} has {len(self.hosts)} hosts")
        chosen = self.hosts[:hosts]
        mpiexec = mpiexec or find_mpiexec()
        cmd = self.on_head([mpiexec, "-launcher", "ssh", "-launcher-exec", str(self.launcher),
                            "-iface", IFACE, "-hosts", ",".join(h.name for h in chosen),
                            "-ppn", str(ranks_per_host), "-n", str(len(chosen) * ranks_per_host),
                            *flags, *argv])
        full = {k: v for k, v in os.environ.items() if k != "COLLECTIVES_RANKS_PER_NODE"}
        return cmd, {**full, **NETWORK_ENV[netmod], **(env or {})}

    # --- faults and measurements ------------------------------------------------------------

    def processes(self, which: int | str | Host) -> dict[int, str]:
        """pid -> command name of every process running on a host."""
        return {pid: comm for pid, (comm, _) in _processes_in(NETNS / self.host(which).netns).items()}

    def kill(self, which: int | str | Host, *, ranks_only: bool = False) -> list[int]:
        """SIGKILL every process on a host: the host dies. ``ranks_only`` kills only what the
        MPI launcher's daemon there (hydra's proxy, Open MPI's prted) started: the ranks die,
        the host and its daemon stay up."""
        procs = _processes_in(NETNS / self.host(which).netns)

        def started_by_daemon(pid: int) -> bool:
            parent = procs[pid][1]
            while parent in procs:
                if procs[parent][0] in MPI_DAEMONS:
                    return True
                parent = procs[parent][1]
            return False

        victims = [pid for pid in procs if not ranks_only or started_by_daemon(pid)]
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return victims

    def set_link(self, which: int | str | Host, up: bool) -> None:
        """Unplug (``up=False``) or plug back a host's cable at the bridge."""
        _run(tool("ip"), "-n", self.head, "link", "set", self.host(which).port,
             "up" if up else "down")

    def set_rate(self, which: int | str | Host, rate: str | None) -> None:
        """Shape a host's link to ``rate`` both ways (tbf at each end), or lift the limit."""
        h = self.host(which)
        for netns, dev in ((h.netns, IFACE), (self.head, h.port)):
            if rate is None:
                subprocess.run([tool("tc"), "-n", netns, "qdisc", "del", "dev", dev, "root"],
                               capture_output=True)
                continue
            # burst: 1 ms at the rate, and at least one 64 KiB segment of the veth's offloads
            burst = max(int(parse_rate(rate) / 8 / 1000), 128 << 10)
            _run(tool("tc"), "-n", netns, "qdisc", "replace", "dev", dev, "root", "tbf",
                 "rate", rate, "burst", str(burst), "latency", "50ms")

    def reset(self) -> None:
        """Kill every process in the lab (mpiexec on the head too) and plug every cable back."""
        _kill_all([self.head] + [h.netns for h in self.hosts])
        for h in self.hosts:
            self.set_link(h, True)

    def traffic(self, which: int | str | Host) -> tuple[int, int]:
        """(bytes sent, bytes received) by a host over its link so far."""
        out = _run(tool("ip"), "-n", self.head, "-j", "-s", "link", "show", self.host(which).port)
        stats = json.loads(out)[0]["stats64"]
        return stats["rx"]["bytes"], stats["tx"]["bytes"]  # the port receives what the host sends


def find_mpiexec() -> str:
    """The ``mpiexec`` next to this Python (the MPICH wheel's hydra), else the one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if not found:
        raise RuntimeError("lab: no mpiexec next to this Python or on PATH "
                           "(pip install -e '.[mpi]' brings MPICH's)")
    return found


def _processes_in(netns_file: Path) -> dict[int, tuple[str, int]]:
    """pid -> (command name, parent pid) of the processes in a network namespace."""
    try:
        target = os.stat(netns_file)
    except OSError:
        return {}
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            ns = os.stat(f"/proc/{entry.name}/ns/net")
            if (ns.st_dev, ns.st_ino) == (target.st_dev, target.st_ino):
                stat = Path(f"/proc/{entry.name}/stat").read_text()
                comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:]
                found[int(entry.name)] = (comm, int(rest.split()[1]))
        except (OSError, ValueError):
            continue
    return found


def _kill_all(namespaces: Sequence[str]) -> None:
    for _ in range(50):
        alive = [pid for ns in namespaces for pid in _processes_in(NETNS / ns)]
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not alive:
            break
        time.sleep(0.02)


def _remove(name: str, namespaces: Sequence[str]) -> None:
    """Kill what runs in a lab's namespaces, delete them, unmount its UTS files, drop its folder."""
    _kill_all(namespaces)
    for ns in namespaces:
        if (NETNS / ns).exists():
            subprocess.run([tool("ip"), "netns", "del", ns], capture_output=True)
    folder = STATE / name
    for uts in folder.glob("*.uts"):
        subprocess.run(["umount", str(uts)], capture_output=True)
    shutil.rmtree(folder, ignore_errors=True)


def cleanup(*, stale_only: bool = True) -> list[str]:
    """Remove labs whose owning process is gone (``stale_only``), or every lab, including
    leftovers of a run killed half-way. Returns the names removed."""
    names = {p.name for p in STATE.glob(PREFIX + "*")} if STATE.exists() else set()
    names |= {p.name.rsplit("-", 1)[0] for p in NETNS.glob(PREFIX + "*")} if NETNS.exists() else set()
    removed = []
    for name in sorted(names):
        if stale_only and not _is_stale(name):
            continue
        _remove(name, [p.name for p in NETNS.glob(f"{name}-*")])
        removed.append(name)
    return removed


def _is_stale(name: str) -> bool:
    folder = STATE / name
    try:
        owner = json.loads((folder / "lab.json").read_text())["owner"]
    except (OSError, ValueError, KeyError):
        # no state: a lab being made right now (fresh), or the remains of a broken one
        return not folder.exists() or time.time() - folder.stat().st_mtime > 60
    return owner is not None and _start_time(owner[0]) != owner[1]


# --- teardown at exit and on signals ----------------------------------------------------------

_OWNED: dict[str, Lab] = {}
_PREVIOUS: dict[int, object] = {}


def _down_owned() -> None:
    for lab in list(_OWNED.values()):
        if lab.owner and lab.owner[0] == os.getpid():  # not in a forked child
            lab.down()


def _on_signal(signum: int, frame) -> None:
    _down_owned()
    previous = _PREVIOUS.get(signum)
    if callable(previous):
        previous(signum, frame)
    else:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


_installed_in: list[int] = []


def _install_handlers() -> None:
    """Once per process: atexit, and SIGTERM/SIGHUP unless ignored (their old handler runs
    after the teardown). Off the main thread only atexit and the ``with`` block remain."""
    if os.getpid() in _installed_in:
        return
    _installed_in.append(os.getpid())
    atexit.register(_down_owned)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        try:
            if signal.getsignal(signum) != signal.SIG_IGN:
                _PREVIOUS[signum] = signal.signal(signum, _on_signal)
        except ValueError:
            return  # not the main thread


# --- command line -----------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="make a lab that stays until `down`; prints its name")
    up.add_argument("-n", "--hosts", type=int, default=2)
    up.add_argument("--rate", help="shape every link, tc syntax: 2gbit, 500mbit")
    up.add_argument("--name", help=f"the lab's name (default {PREFIX}<random>)")
    down = sub.add_parser("down", help="remove a lab, or every lab and leftover (--all)")
    down.add_argument("name", nargs="?")
    down.add_argument("--all", action="store_true")
    run = sub.add_parser("run", help="mpiexec across the lab's hosts: run NAME [-ppn K] -- cmd")
    run.add_argument("name")
    run.add_argument("-ppn", "--ranks-per-host", type=int, default=1)
    run.add_argument("-hosts", "--hosts", type=int, help="use the first HOSTS hosts (default all)")
    ex = sub.add_parser("exec", help="run a command on one host: exec NAME HOST -- cmd")
    ex.add_argument("name")
    ex.add_argument("host")
    sub.add_parser("list", help="the labs on this machine")
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:split]), argv[split + 1:]
    if args.command in ("run", "exec") and not command:
        parser.error(f"{args.command}: give the command after --")
    if args.command == "up":
        print(Lab(args.hosts, rate=args.rate, name=args.name, persistent=True).up().name)
    elif args.command == "down":
        if args.all == (args.name is not None):
            parser.error("down takes a lab's name or --all")
        if args.all:
            print("\n".join(cleanup(stale_only=False)))
        else:
            Lab.load(args.name).down()
    elif args.command == "list":
        for folder in sorted(STATE.glob(PREFIX + "*")) if STATE.exists() else []:
            print(folder.name, (folder / "lab.json").read_text() if (folder / "lab.json").exists()
                  else "(no state)")
    else:
        lab = Lab.load(args.name)
        if args.command == "run":
            cmd, env = lab.mpiexec(command, hosts=args.hosts, ranks_per_host=args.ranks_per_host)
        else:
            cmd, env = lab.on_host(args.host, command), dict(os.environ)
        return subprocess.run(cmd, env=env).returncode
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, RuntimeError) as exc:
        sys.exit(f"lab.py: {exc}")
