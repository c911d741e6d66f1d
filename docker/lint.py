#!/usr/bin/env python3
"""Static checks of docker/: both Dockerfiles, the build context, compose.yaml and k8s/.

Usage: python3 docker/lint.py [--server BIN]     (needs PyYAML: apt-get install python3-yaml)

Dockerfiles: parsed as Docker does (parser directives, comments, line continuations); every
instruction known, exec forms valid JSON, every ${VAR} outside RUN declared in scope (a global
ARG is visible in a stage only when the stage declares it again), every ${VAR} in a RUN a
declared ARG or ENV, COPY --from naming an earlier stage, every RUN a valid bash script
(`bash -n`), the final stage running as a non-root numeric user with a HEALTHCHECK and an exec
ENTRYPOINT. docker/Dockerfile.cuda must hold the same instructions as docker/Dockerfile except
FROM and ARG lines (and the description and base-name labels).

Build context: the repository root filtered by docker/Dockerfile.dockerignore, with Docker's
matching rules: it must hold the sources and docker/image-build.sh and nothing from .git or
build directories.

compose.yaml and k8s/*.yaml: valid YAML, and the ports, probes, user, drain timeout and grace
periods agree with the image.

With --server BIN (a built qlinear-server): every flag the image's ENTRYPOINT, compose's server
command and the Kubernetes containers' args give the server is one that `BIN --help` lists (a
flag renamed in the server would otherwise stop every container at start-up, exit 2).

Prints one line per file and exits 1 on any error.
"""
import fnmatch
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
errors = []


def error(where, msg):
    errors.append(f"{where}: {msg}")


# --------------------------------------------------------------------------------------------
# Dockerfiles

INSTRUCTIONS = {
    "FROM", "RUN", "CMD", "LABEL", "MAINTAINER", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT",
    "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}
# Instructions whose arguments Docker expands ${VAR} in.
EXPANDING = {"FROM", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "VOLUME", "USER", "WORKDIR", "ARG",
             "STOPSIGNAL"}
PREDEFINED_ARGS = {"HTTP_PROXY", "HTTPS_PROXY", "FTP_PROXY", "NO_PROXY", "ALL_PROXY",
                   "http_proxy", "https_proxy", "ftp_proxy", "no_proxy", "all_proxy",
                   "TARGETPLATFORM", "TARGETOS", "TARGETARCH", "TARGETVARIANT", "BUILDPLATFORM",
                   "BUILDOS", "BUILDARCH", "BUILDVARIANT"}
VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::[-+][^}]*)?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


class Instr:
    def __init__(self, line, keyword, args):
        self.line, self.keyword, self.args = line, keyword, args

    def key(self):
        return (self.keyword, " ".join(self.args.split()))


def parse_dockerfile(path):
    """Returns the instructions of a Dockerfile as Docker's parser reads them."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    escape = "\\"
    i = 0
    # Parser directives: only at the very top, before any comment, blank line or instruction.
    while i < len(lines):
        m = re.match(r"^#\s*([a-zA-Z]+)\s*=\s*(\S+)\s*$", lines[i])
        if not m:
            break
        if m.group(1).lower() == "escape":
            escape = m.group(2)
        i += 1
    instrs = []
    cur, start = None, 0
    for n in range(i, len(lines)):
        raw = lines[n]
        stripped = raw.strip()
        if stripped.startswith("#"):
            continue  # comments are dropped, even inside a continuation
        if cur is None:
            if not stripped:
                continue
            cur, start = "", n + 1
        elif not stripped:
            continue  # an empty continuation line
        text = raw.rstrip()
        if text.endswith(escape):
            cur += text[: -len(escape)] + " "
            continue
        cur += text
        kw, _, rest = cur.strip().partition(" ")
        instrs.append(Instr(start, kw.upper(), rest.strip()))
        cur = None
    if cur is not None:
        error(path, f"line {start}: the file ends inside a line continuation")
    return instrs


def split_flags(args):
    """Splits leading --flag=value options off an instruction's arguments."""
    flags = {}
    rest = args
    while rest.startswith("--"):
        tok, _, rest = rest.partition(" ")
        name, _, value = tok[2:].partition("=")
        flags[name] = value
        rest = rest.lstrip()
    return flags, rest


def exec_form(where, args):
    try:
        v = json.loads(args)
    except ValueError as e:
        error(where, f"not valid JSON exec form ({e}): {args}")
        return None
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        error(where, f"exec form must be a JSON array of strings: {args}")
        return None
    return v


def check_dockerfile(path, context_files):
    rel = os.path.relpath(path, ROOT)
    instrs = parse_dockerfile(path)
    global_args = {}
    stages = []  # dicts: name, base, instrs, args, env
    stage = None
    for ins in instrs:
        where = f"{rel}:{ins.line}"
        if ins.keyword not in INSTRUCTIONS:
            error(where, f"unknown instruction {ins.keyword}")
            continue
        if ins.keyword == "FROM":
            flags, rest = split_flags(ins.args)
            parts = rest.split()
            name = None
            if len(parts) == 3 and parts[1].upper() == "AS":
                name = parts[2]
            elif len(parts) != 1:
                error(where, f"FROM takes IMAGE [AS NAME]: {ins.args}")
            for m in VAR_RE.finditer(rest):
                v = m.group(1) or m.group(2)
                if v not in global_args and v not in PREDEFINED_ARGS:
                    error(where, f"FROM uses ${v}, which no ARG before the first FROM declares")
            if name and any(s["name"] == name for s in stages):
                error(where, f"stage name {name} used twice")
            stage = {"name": name, "base": parts[0] if parts else "", "instrs": [],
                     "scope": set(PREDEFINED_ARGS), "line": ins.line}
            stages.append(stage)
            continue
        if stage is None:
            if ins.keyword != "ARG":
                error(where, f"{ins.keyword} before the first FROM")
                continue
            for decl in ins.args.split():
                k, _, v = decl.partition("=")
                for m in VAR_RE.finditer(v):
                    ref = m.group(1) or m.group(2)
                    if ref not in global_args:
                        error(where, f"ARG {k} refers to undeclared ${ref}")
                global_args[k] = v
            continue
        stage["instrs"].append(ins)
        scope = stage["scope"]
        if ins.keyword in EXPANDING:
            for m in VAR_RE.finditer(ins.args):
                v = m.group(1) or m.group(2)
                if v not in scope:
                    hint = " (a global ARG needs `ARG NAME` inside the stage)" \
                        if v in global_args else ""
                    error(where, f"{ins.keyword} uses ${v}, not declared in this stage{hint}")
        if ins.keyword == "ARG":
            for decl in ins.args.split():
                scope.add(decl.partition("=")[0])
        elif ins.keyword == "ENV":
            for m in re.finditer(r"([A-Za-z_][A-Za-z0-9_]*)=", ins.args):
                scope.add(m.group(1))
        elif ins.keyword == "RUN":
            flags, body = split_flags(ins.args)
            if body.startswith("["):
                exec_form(where, body)
            else:
                for m in re.finditer(r"\$\{([A-Z_][A-Z0-9_]*)", body):
                    if m.group(1) not in scope:
                        error(where, f"RUN uses ${{{m.group(1)}}}, not an ARG or ENV of this stage")
                with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as t:
                    t.write(body + "\n")
                r = subprocess.run(["bash", "-n", t.name], capture_output=True, text=True)
                os.unlink(t.name)
                if r.returncode != 0:
                    error(where, f"RUN is not valid shell: {r.stderr.strip()}")
                if "apt-get install" in body:
                    if "--no-install-recommends" not in body:
                        error(where, "apt-get install without --no-install-recommends")
                    if "rm -rf /var/lib/apt/lists" not in body:
                        error(where, "apt lists are not removed in the layer that fetched them")
                for script in re.findall(r"(docker/[\w./-]+\.sh)", body):
                    if script not in context_files:
                        error(where, f"{script} is not in the build context")
        elif ins.keyword in ("CMD", "ENTRYPOINT", "SHELL"):
            if ins.args.startswith("[") or ins.keyword == "SHELL":
                exec_form(where, ins.args)
        elif ins.keyword == "HEALTHCHECK":
            flags, rest = split_flags(ins.args)
            for f in flags:
                if f not in ("interval", "timeout", "start-period", "start-interval", "retries"):
                    error(where, f"unknown HEALTHCHECK option --{f}")
            kw, _, cmd = rest.partition(" ")
            if kw.upper() == "CMD":
                if cmd.strip().startswith("["):
                    exec_form(where, cmd.strip())
            elif kw.upper() != "NONE":
                error(where, "HEALTHCHECK needs CMD or NONE")
        elif ins.keyword in ("COPY", "ADD"):
            flags, rest = split_flags(ins.args)
            if ins.keyword == "ADD":
                error(where, "ADD: use COPY for local files")
            if "from" in flags:
                src = flags["from"]
                names = [s["name"] for s in stages[:-1]]
                if src not in names and not src.isdigit():
                    error(where, f"COPY --from={src}: no earlier stage of that name")
            else:
                srcs = rest.split()[:-1]
                for s in srcs:
                    s = s.rstrip("/") or "."
                    if s != "." and not any(f == s or f.startswith(s + "/")
                                            for f in context_files):
                        error(where, f"COPY {s}: not in the build context")
        elif ins.keyword == "WORKDIR" and not ins.args.startswith(("/", "$")):
            error(where, f"WORKDIR {ins.args} is not absolute")

    if not stages:
        error(rel, "no FROM")
        return None
    final = stages[-1]
    last = {}
    for ins in final["instrs"]:
        last[ins.keyword] = ins
    user = last.get("USER")
    if user is None:
        error(rel, "the final stage sets no USER (it would run as root)")
    else:
        uid = user.args.split(":")[0]
        if not uid.isdigit():
            error(rel, f"USER {user.args}: use a numeric uid so Kubernetes can verify non-root")
        elif int(uid) == 0:
            error(rel, "USER is root")
    if "HEALTHCHECK" not in last:
        error(rel, "the final stage has no HEALTHCHECK")
    ep = last.get("ENTRYPOINT")
    entrypoint = exec_form(f"{rel}:{ep.line}", ep.args) if ep else None
    if not entrypoint:
        error(rel, "the final stage needs an exec-form ENTRYPOINT")
    return {"stages": stages, "user": user.args if user else None, "entrypoint": entrypoint,
            "healthcheck": last.get("HEALTHCHECK"), "expose": last.get("EXPOSE")}


def comparable(df):
    """The instructions that must be equal in both Dockerfiles."""
    out = []
    for s in df["stages"]:
        out.append(("FROM-STAGE", s["name"]))
        for ins in s["instrs"]:
            if ins.keyword == "ARG":
                continue  # defaults differ; what the RUN lines use is checked per stage
            elif ins.keyword == "LABEL":
                text = " ".join(ins.args.split())
                text = re.sub(r'(description|base\.name)="[^"]*"', r'\1=...', text)
                out.append(("LABEL", text))
            else:
                out.append(ins.key())
    return out


# --------------------------------------------------------------------------------------------
# Build context (.dockerignore semantics: patterns in order, `!` re-includes, last match wins)

def read_ignore(path):
    pats = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            neg = line.startswith("!")
            p = os.path.normpath(line.lstrip("!").strip().lstrip("/"))
            pats.append((neg, p))
    return pats


def pattern_re(p):
    out = ""
    i = 0
    while i < len(p):
        if p.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif p.startswith("**", i):
            out += ".*"
            i += 2
        elif p[i] == "*":
            out += "[^/]*"
            i += 1
        elif p[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(p[i])
            i += 1
    return re.compile("^" + out + "$")


def ignored(path, pats):
    """Docker's rule: a path is excluded when the last pattern matching it or one of its parent
    directories is not a `!` pattern."""
    parts = path.split("/")
    result = False
    for neg, p in pats:
        rx = pattern_re(p)
        if any(rx.match("/".join(parts[:k])) for k in range(1, len(parts) + 1)):
            result = not neg
    return result


def build_context(ignore_file):
    pats = read_ignore(ignore_file)
    files = set()
    for dirpath, dirnames, filenames in os.walk(ROOT):
        reldir = os.path.relpath(dirpath, ROOT)
        reldir = "" if reldir == "." else reldir + "/"
        # Docker walks into an excluded directory only when a `!` pattern might re-include
        # something inside it; skipping the rest keeps this quick (build trees are large).
        keep = []
        for d in dirnames:
            p = reldir + d
            if ignored(p, pats) and not any(neg and (q.startswith(p + "/") or "*" in q)
                                            for neg, q in pats):
                continue
            keep.append(d)
        dirnames[:] = keep
        for f in filenames:
            p = reldir + f
            if not ignored(p, pats):
                files.add(p)
    return files


def check_context(files, ignore_rel):
    for must in ("CMakeLists.txt", "docker/image-build.sh", "server/main.cc",
                 "proto/qlinear/v1/qlinear.proto"):
        if must not in files:
            error(ignore_rel, f"{must} is left out of the build context")
    for f in files:
        top = f.split("/")[0]
        if top in (".git", "shared") or fnmatch.fnmatch(top, "build*") or \
                fnmatch.fnmatch(top, "bundle*"):
            error(ignore_rel, f"{f} is in the build context")
            break
    size = sum(os.path.getsize(os.path.join(ROOT, f)) for f in files
               if os.path.isfile(os.path.join(ROOT, f)))
    return size


# --------------------------------------------------------------------------------------------
# compose.yaml and Kubernetes manifests

def flag_value(args, name, default=None):
    val = default
    for a in args or []:
        if a.startswith(f"--{name}="):
            val = a.split("=", 1)[1]
    return val


def check_compose(path, image):
    rel = os.path.relpath(path, ROOT)
    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    svcs = doc.get("services", {})
    server, smoke = svcs.get("server"), svcs.get("smoke")
    if not server or not smoke:
        error(rel, "needs the services server and smoke")
        return
    for name, svc in svcs.items():
        b = svc.get("build", {})
        if b and b.get("dockerfile") != "docker/Dockerfile":
            error(rel, f"{name}: builds {b.get('dockerfile')}, not docker/Dockerfile")
    hc = server.get("healthcheck", {}).get("test", [])
    if "health" not in hc:
        error(rel, "server: the health check should run `qlinear-cli health`")
    dep = smoke.get("depends_on", {}).get("server", {})
    if dep.get("condition") != "service_healthy":
        error(rel, "smoke must wait for server's health (condition: service_healthy)")
    if "smoke" not in (smoke.get("command") or []):
        error(rel, "smoke: the command should be `qlinear-cli ... smoke`")
    drain_ms = int(flag_value(server.get("command"), "drain-timeout-ms", "10000"))
    grace = server.get("stop_grace_period", "10s")
    m = re.fullmatch(r"(\d+)s", str(grace))
    if not m or int(m.group(1)) * 1000 <= drain_ms:
        error(rel, f"stop_grace_period {grace} must exceed --drain-timeout-ms={drain_ms}")
    container_ports = {p.split(":")[-1] for p in server.get("ports", [])}
    for port in image["ports"]:
        if port not in container_ports:
            error(rel, f"server does not publish the image's port {port}")


def check_k8s(dirpath, image):
    docs = []
    for name in sorted(os.listdir(dirpath)):
        if not name.endswith(".yaml"):
            continue
        path = os.path.join(dirpath, name)
        with open(path, encoding="utf-8") as f:
            for d in yaml.safe_load_all(f):
                if d is not None:
                    docs.append((name, d))
    by_kind = {}
    for name, d in docs:
        for k in ("apiVersion", "kind"):
            if k not in d:
                error(f"docker/k8s/{name}", f"a document without {k}")
        by_kind.setdefault(d.get("kind"), []).append((name, d))
        if d.get("kind") == "Kustomization":
            for r in d.get("resources", []):
                if not os.path.exists(os.path.join(dirpath, r)):
                    error(f"docker/k8s/{name}", f"resource {r} does not exist")
    deployments = by_kind.get("Deployment", [])
    if not any(n == "deployment-gpu.yaml" for n, _ in deployments):
        error("docker/k8s", "no GPU Deployment (deployment-gpu.yaml)")
    grpc_port, metrics_port = int(image["ports"][0]), int(image["ports"][1])
    pod_labels = []
    for name, d in deployments:
        where = f"docker/k8s/{name}"
        spec = d["spec"]
        tmpl = spec["template"]
        labels = tmpl["metadata"].get("labels", {})
        pod_labels.append(labels)
        sel = spec["selector"]["matchLabels"]
        if any(labels.get(k) != v for k, v in sel.items()):
            error(where, "the selector does not match the pod template's labels")
        pspec = tmpl["spec"]
        psc = pspec.get("securityContext", {})
        if psc.get("runAsNonRoot") is not True:
            error(where, "securityContext.runAsNonRoot must be true")
        image_uid = int(image["user"].split(":")[0])
        if psc.get("runAsUser") not in (None, image_uid):
            error(where, f"runAsUser {psc.get('runAsUser')} is not the image's user {image_uid}")
        ann = tmpl["metadata"].get("annotations", {})
        if ann.get("prometheus.io/scrape") != "true" or \
                ann.get("prometheus.io/port") != str(metrics_port):
            error(where, f"needs prometheus.io/scrape and prometheus.io/port={metrics_port}")
        c = pspec["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        if ports.get("grpc") != grpc_port or ports.get("metrics") != metrics_port:
            error(where, f"container ports must be grpc={grpc_port}, metrics={metrics_port}")
        for probe in ("startupProbe", "readinessProbe"):
            p = c.get(probe)
            if not p or p.get("grpc", {}).get("port") != grpc_port:
                error(where, f"{probe} must be a gRPC probe on port {grpc_port}")
        # Liveness goes around gRPC's threads, which streams can all hold.
        get = c.get("livenessProbe", {}).get("httpGet", {})
        if get.get("path") != "/healthz" or get.get("port") not in (metrics_port, "metrics"):
            error(where, f"livenessProbe must be an HTTP GET of /healthz on port {metrics_port}")
        # The stop: --shutdown-delay-ms of NOT_SERVING while still serving, then the drain.
        drain_ms = int(flag_value(c.get("args"), "drain-timeout-ms", "10000")) + int(
            flag_value(c.get("args"), "shutdown-delay-ms", "0"))
        grace = pspec.get("terminationGracePeriodSeconds", 30)
        if grace * 1000 <= drain_ms:
            error(where, f"terminationGracePeriodSeconds {grace} must exceed the shutdown delay "
                         f"and the drain ({drain_ms} ms)")
        live = c.get("livenessProbe", {})
        if live.get("periodSeconds", 10) * live.get("failureThreshold", 3) * 1000 <= drain_ms:
            error(where, "the liveness probe could restart a pod while it drains")
        res = c.get("resources", {})
        if not res.get("requests") or not res.get("limits"):
            error(where, "resources need requests and limits")
        gpu = res.get("limits", {}).get("nvidia.com/gpu")
        if name == "deployment-gpu.yaml" and gpu != 1:
            error(where, "the GPU variant must ask for nvidia.com/gpu: 1")
        if name != "deployment-gpu.yaml" and gpu:
            error(where, "the CPU variant asks for a GPU")
        csc = c.get("securityContext", {})
        if csc.get("allowPrivilegeEscalation") is not False or \
                "ALL" not in csc.get("capabilities", {}).get("drop", []):
            error(where, "container securityContext must drop ALL and forbid escalation")
    services = by_kind.get("Service", [])
    if not any(d["spec"].get("clusterIP") == "None" for _, d in services):
        error("docker/k8s", "no headless Service (clusterIP: None)")
    if not any(d["spec"].get("type", "ClusterIP") == "ClusterIP" and
               d["spec"].get("clusterIP") != "None" for _, d in services):
        error("docker/k8s", "no ClusterIP Service")
    for name, d in services + by_kind.get("PodDisruptionBudget", []):
        sel = d["spec"].get("selector", {})
        sel = sel.get("matchLabels", sel)
        for labels in pod_labels:
            if any(labels.get(k) != v for k, v in sel.items()):
                error(f"docker/k8s/{name}", f"{d['metadata']['name']}: selector {sel} misses "
                                            f"pods labelled {labels}")
        for p in d["spec"].get("ports", []):
            if p.get("name") == "grpc" and p.get("targetPort") not in ("grpc", grpc_port):
                error(f"docker/k8s/{name}", "the grpc port must target the container's grpc")
    if not by_kind.get("PodDisruptionBudget"):
        error("docker/k8s", "no PodDisruptionBudget")
    return len(docs)


# --------------------------------------------------------------------------------------------
# The server's flags

def server_flags(binary):
    """The flag names `binary --help` lists (on/off flags also as --no-NAME)."""
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    names = set(re.findall(r"^\s+--([a-z0-9][a-z0-9-]*)", out.stdout + out.stderr, re.M))
    names |= set(re.findall(r"\| --(no-[a-z0-9-]+)", out.stdout + out.stderr))
    return names


def check_server_args(where, args, known):
    for a in args or []:
        if not isinstance(a, str) or not a.startswith("--"):
            continue
        name = a[2:].split("=", 1)[0]
        if name not in known:
            error(where, f"{a}: qlinear-server has no flag --{name} (see qlinear-server --help)")


def k8s_server_args(dirpath):
    """(file, args) of each Deployment container running the image's entrypoint."""
    found = []
    for name in sorted(os.listdir(dirpath)):
        if not name.endswith(".yaml"):
            continue
        with open(os.path.join(dirpath, name), encoding="utf-8") as f:
            for d in yaml.safe_load_all(f):
                if not d or d.get("kind") != "Deployment":
                    continue
                for c in d["spec"]["template"]["spec"].get("containers", []):
                    if not c.get("command"):
                        found.append((f"docker/k8s/{name}", c.get("args")))
    return found


def check_flags(binary, entrypoint):
    known = server_flags(binary)
    if not known:
        error(binary, "--help listed no flags")
        return 0, 0
    check_server_args("docker/Dockerfile ENTRYPOINT", entrypoint[1:], known)
    with open(os.path.join(HERE, "compose.yaml"), encoding="utf-8") as f:
        svcs = yaml.safe_load(f).get("services", {})
    n = 0
    for name, svc in svcs.items():
        if "entrypoint" not in svc:  # the image's entrypoint: the server
            check_server_args(f"docker/compose.yaml: {name}", svc.get("command"), known)
            n += 1
    for where, args in k8s_server_args(os.path.join(HERE, "k8s")):
        check_server_args(where, args, known)
        n += 1
    return len(known), n


# --------------------------------------------------------------------------------------------

def main():
    server = None
    argv = sys.argv[1:]
    if argv[:1] == ["--server"] and len(argv) == 2:
        server = argv[1]
    elif argv:
        print("usage: python3 docker/lint.py [--server BIN]", file=sys.stderr)
        return 2
    ignore = os.path.join(HERE, "Dockerfile.dockerignore")
    files = build_context(ignore)
    size = check_context(files, "docker/Dockerfile.dockerignore")
    print(f"lint: build context: {len(files)} files, {size / 1024:.0f} KiB")
    cuda_ignore = os.path.join(HERE, "Dockerfile.cuda.dockerignore")
    if read_ignore(cuda_ignore) != read_ignore(ignore):
        error("docker/Dockerfile.cuda.dockerignore", "differs from Dockerfile.dockerignore")

    cpu = check_dockerfile(os.path.join(HERE, "Dockerfile"), files)
    cuda = check_dockerfile(os.path.join(HERE, "Dockerfile.cuda"), files)
    for name, df in (("Dockerfile", cpu), ("Dockerfile.cuda", cuda)):
        if df:
            n = sum(len(s["instrs"]) + 1 for s in df["stages"])
            print(f"lint: docker/{name}: {len(df['stages'])} stages, {n} instructions")
    if cpu and cuda:
        a, b = comparable(cpu), comparable(cuda)
        if a != b:
            for x, y in zip(a, b):
                if x != y:
                    error("docker/Dockerfile.cuda", f"differs from docker/Dockerfile: {y} vs {x}")
                    break
            else:
                error("docker/Dockerfile.cuda", "has a different number of instructions")
        else:
            print(f"lint: docker/Dockerfile.cuda: the same {len(a)} steps as docker/Dockerfile "
                  "apart from FROM and ARG defaults")
    if not cpu or not cpu["entrypoint"] or not cpu["user"] or \
            not cpu["user"].split(":")[0].isdigit():
        return finish()
    ep = cpu["entrypoint"]
    image = {
        "user": cpu["user"],
        "ports": [flag_value(ep, "port"), flag_value(ep, "metrics-port")],
    }
    if None in image["ports"]:
        error("docker/Dockerfile", "the ENTRYPOINT should set --port and --metrics-port")
        return finish()
    exposed = cpu["expose"].args.split() if cpu["expose"] else []
    if sorted(exposed) != sorted(image["ports"]):
        error("docker/Dockerfile", f"EXPOSE {exposed} is not the entrypoint's ports")
    hc = cpu["healthcheck"].args if cpu["healthcheck"] else ""
    if f"127.0.0.1:{image['ports'][0]}" not in hc:
        error("docker/Dockerfile", "the HEALTHCHECK does not probe the entrypoint's port")

    check_compose(os.path.join(HERE, "compose.yaml"), image)
    print("lint: docker/compose.yaml: services server, smoke")
    n = check_k8s(os.path.join(HERE, "k8s"), image)
    print(f"lint: docker/k8s: {n} documents")
    if server:
        known, users = check_flags(server, ep)
        print(f"lint: server flags: the entrypoint and {users} compose services and Kubernetes "
              f"containers checked against the {known} flags of {server} --help")
    return finish()


def finish():
    for e in errors:
        print(f"lint: ERROR {e}", file=sys.stderr)
    print(f"lint: {'FAIL' if errors else 'ok'} ({len(errors)} errors)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
