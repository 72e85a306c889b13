"""Offline checks of loom's Kubernetes files (examples/k8s), run by
tests/cluster/k8s.sh in a virtual environment with kubernetes-validate.

  k8s_check.py LOOM SRC TMP

1. Schemas. The ConfigMaps, PersistentVolumeClaims, Service and Job
   against the Kubernetes OpenAPI schemas kubernetes-validate bundles
   (strict: unknown fields are errors), for the oldest version the
   manifests claim (MIN_K8S) and the newest bundled. The MPIJob (a custom
   resource: no schema in that package) against MPIJOB_SCHEMA, written from
   the MPI operator's kubeflow.org/v2beta1 API (MPIJobSpec, RunPolicy,
   ReplicaSpec), whose pod templates are checked against Kubernetes' own
   PodTemplateSpec, and against the rules the operator's validation applies
   (Launcher with 1 replica, restart policies, clean pod policies, names).
2. What a schema cannot see: the commands use flags `loom run --help` and
   `loom train --help` list, and `loom run --dry-run` accepts the launcher's
   command with a hostfile written as the operator writes it; the training
   config of each ConfigMap passes `loom config check`; every environment
   variable name is one loom reads (or one of the env:// start); the numbers
   agree (-n = workers x slotsPerWorker, threads x slots = the cpu limit,
   WORLD_SIZE = completions = parallelism, the rendezvous address and port);
   the config and run directory are mounted where the ranks run; the two
   files' volume claims are the same; the image (examples/k8s/Containerfile)
   installs the packages the built binary's libraries come from, packages
   that exist in Debian (when apt's lists are there), and the user and ssh
   settings the MPIJob relies on.
3. Each check can fail: every entry of MUTATIONS breaks one thing in a copy
   of the files, and the checks must report it.
"""

import copy
import json
import os
import re
import subprocess
import sys

import jsonschema
import referencing
import referencing.jsonschema
import yaml
from kubernetes_validate import utils as kv

MIN_K8S = "1.29"  # the oldest version indexed-job.yaml claims
RUN_USER_UID = 1000  # the image's user (Containerfile: useradd --uid)
# The env:// start (torchrun's variables), read by loom train when
# LOOM_INIT=env://.
ENV_INIT = {"LOOM_INIT", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"}
# Read by the libraries loom uses (OpenMP, OpenBLAS).
ENV_OTHER = {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"

# kubeflow.org/v2beta1 MPIJob, from the operator's API types
# (pkg/apis/kubeflow/v2beta1/types.go): every field with its type, enums
# from its validation; no other field. Pod templates are Kubernetes'
# PodTemplateSpec (resolved in the bundled definitions).
_POD_TEMPLATE = {"$ref": "/api/_definitions.json#/$defs/io.k8s.api.core.v1.PodTemplateSpec"}
_REPLICA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["replicas", "template"],
    "properties": {
        "replicas": {"type": "integer", "minimum": 0},
        "restartPolicy": {"enum": ["Always", "OnFailure", "Never", "ExitCode"]},
        "template": _POD_TEMPLATE,
    },
}
MPIJOB_SCHEMA = {
    "$id": "https://kubernetes.io/api/mpijob-kubeflow-v2beta1.json",
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "kubeflow.org/v2beta1"},
        "kind": {"const": "MPIJob"},
        "metadata": {"$ref": "/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["mpiReplicaSpecs"],
            "properties": {
                "slotsPerWorker": {"type": "integer", "minimum": 0},
                "runLauncherAsWorker": {"type": "boolean"},
                "runPolicy": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "cleanPodPolicy": {"enum": ["None", "Running", "All"]},
                        "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
                        "activeDeadlineSeconds": {"type": "integer", "minimum": 0},
                        "backoffLimit": {"type": "integer", "minimum": 0},
                        "schedulingPolicy": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "minAvailable": {"type": "integer"},
                                "queue": {"type": "string"},
                                "minResources": {"type": "object"},
                                "priorityClass": {"type": "string"},
                                "scheduleTimeoutSeconds": {"type": "integer"},
                            },
                        },
                        "suspend": {"type": "boolean"},
                        "managedBy": {"enum": ["kubeflow.org/mpi-operator", "kueue.x-k8s.io/multikueue"]},
                    },
                },
                "mpiReplicaSpecs": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["Launcher"],
                    "properties": {"Launcher": _REPLICA, "Worker": _REPLICA},
                },
                "sshAuthMountPath": {"type": "string", "minLength": 1},
                "launcherCreationPolicy": {"enum": ["AtStartup", "WaitForWorkersReady"]},
                "mpiImplementation": {"enum": ["OpenMPI", "Intel", "MPICH"]},
            },
        },
    },
}


class Files:
    """The parsed manifests (file -> list of documents) and the Containerfile."""

    def __init__(self, src):
        self.dir = os.path.join(src, "examples", "k8s")
        self.docs = {}
        for name in ("mpijob.yaml", "indexed-job.yaml"):
            with open(os.path.join(self.dir, name)) as f:
                self.docs[name] = [d for d in yaml.safe_load_all(f) if d is not None]
        with open(os.path.join(self.dir, "Containerfile")) as f:
            self.containerfile = f.read()

    def one(self, name, kind):
        found = [d for d in self.docs[name] if d.get("kind") == kind]
        if len(found) != 1:
            raise Check("%s: %d documents of kind %s, expected 1" % (name, len(found), kind))
        return found[0]


class Check(Exception):
    pass


class Checker:
    def __init__(self, loom, src, tmp):
        self.loom, self.src, self.tmp = loom, src, tmp
        self.versions = sorted({MIN_K8S, kv.major_minor(kv.latest_version())}, key=lambda v: tuple(map(int, v.split("."))))
        self.validators = {}
        self.run_flags = self.help_flags(["run", "--help"])
        self.train_flags = self.help_flags(["train", "--help"])
        self.env_names = self.loom_env_names()
        self.apt = self.apt_works()
        self.pkgs_exist = {}

    # -- helpers ---------------------------------------------------------

    def help_flags(self, args):
        """{flag: takes a value} from `loom CMD --help`."""
        out = subprocess.run([self.loom] + args, capture_output=True, text=True).stdout
        flags = {}
        for line in out.splitlines():
            m = re.match(r"^\s+(?:(-[A-Za-z]), )?(--[a-z][a-z-]*)((?: \S+)?)(?:\s{2,}|$)", line)
            if m:
                for f in (m.group(1), m.group(2)):
                    if f:
                        flags[f] = bool(m.group(3))
        if len(flags) < 4:
            raise SystemExit("cannot read the options of loom %s:\n%s" % (" ".join(args), out))
        return flags

    def loom_env_names(self):
        """Every LOOM_* name loom's sources spell as a string."""
        names = set()
        for root, _, files in os.walk(os.path.join(self.src, "src")):
            for fn in files:
                if fn.endswith((".c", ".h")):
                    with open(os.path.join(root, fn), errors="replace") as f:
                        names |= set(re.findall(r'"(LOOM_[A-Z0-9_]+)"', f.read()))
        return names

    @staticmethod
    def apt_works():
        try:
            r = subprocess.run(["apt-cache", "show", "bash"], capture_output=True, text=True)
            return r.returncode == 0 and "Package: bash" in r.stdout
        except OSError:
            return False

    def validator(self, version, kind_file, schema=None):
        key = (version, kind_file)
        if key not in self.validators:
            strict = "kubernetes-json-schema/v%s.0-local-strict/" % version
            defs = kv.schema_contents(strict + "_definitions.json", version)
            if schema is None:
                schema = kv.schema_contents(strict + kind_file, version)
            registry = referencing.Registry().with_resources(
                [
                    ("https://kubernetes.io/api/_definitions.json", referencing.Resource.from_contents(defs)),
                ]
            )
            if "$id" not in schema:
                schema = dict(schema, **{"$id": "https://kubernetes.io/api/" + kind_file})
            self.validators[key] = jsonschema.Draft202012Validator(schema, registry=registry)
        return self.validators[key]

    def schema_errors(self, doc, version, kind_file, schema=None):
        v = self.validator(version, kind_file, schema)
        return ["%s: %s" % ("/".join(str(p) for p in e.absolute_path) or "(top)", e.message) for e in v.iter_errors(doc)]

    # -- 1. schemas ------------------------------------------------------

    def check_schemas(self, files, fail):
        kinds = {"ConfigMap", "PersistentVolumeClaim", "Service", "Job", "MPIJob"}
        for name, docs in files.docs.items():
            for d in docs:
                kind = d.get("kind")
                if kind not in kinds:
                    fail("%s: a %s (only %s are checked)" % (name, kind, ", ".join(sorted(kinds))))
                    continue
                what = "%s %s/%s" % (name, kind, d.get("metadata", {}).get("name"))
                for ver in self.versions:
                    schema = "Kubernetes %s schema" % ver
                    if kind == "MPIJob":
                        schema = "v2beta1 schema (pod templates of Kubernetes %s)" % ver
                        errs = self.schema_errors(d, ver, "mpijob-kubeflow-v2beta1.json", MPIJOB_SCHEMA)
                    else:
                        api = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", d.get("apiVersion", "?"))
                        try:
                            errs = self.schema_errors(d, ver, "%s-%s.json" % (kind.lower(), api))
                        except FileNotFoundError:
                            errs = ["no schema for %s %s" % (d.get("apiVersion"), kind)]
                    for e in errs:
                        fail("%s: %s: %s" % (what, schema, e))
        self.check_mpijob_rules(files, fail)

    def check_mpijob_rules(self, files, fail):
        """The operator's own validation (pkg/apis/kubeflow/validation)."""
        job = files.one("mpijob.yaml", "MPIJob")
        spec = job.get("spec", {})
        name = job.get("metadata", {}).get("name", "")
        reps = spec.get("mpiReplicaSpecs", {})
        workers = reps.get("Worker", {}).get("replicas", 1)
        host = "%s-worker-%d" % (name, max(int(workers) if isinstance(workers, int) else 1, 1) - 1)
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", host):
            fail("MPIJob: pods would be named %r, not a DNS-1035 label" % host)
        for key in ("slotsPerWorker", "sshAuthMountPath", "mpiImplementation"):
            if key not in spec:
                fail("MPIJob: spec.%s is not set (the operator defaults it; this image needs it said)" % key)
        if "cleanPodPolicy" not in spec.get("runPolicy", {}):
            fail("MPIJob: spec.runPolicy.cleanPodPolicy is not set")
        for role, r in reps.items():
            if r.get("restartPolicy") not in ("Never", "OnFailure"):
                fail("MPIJob: %s restartPolicy %r: the operator takes Never or OnFailure" % (role, r.get("restartPolicy")))
            if not r.get("template", {}).get("spec", {}).get("containers"):
                fail("MPIJob: %s has no container" % role)
        if reps.get("Launcher", {}).get("replicas") != 1:
            fail("MPIJob: Launcher replicas must be 1")
        if "Worker" not in reps or not isinstance(workers, int) or workers < 1:
            fail("MPIJob: Worker replicas must be 1 or more")

    # -- 2. what a schema cannot see ---------------------------------------

    def parse_cmd(self, cmd, where, fail):
        """loom [run OPTS...] loom train CONFIG OPTS... -> (run options, train args)."""
        cmd = [str(c) for c in cmd]
        run = {}
        if len(cmd) < 2 or os.path.basename(cmd[0]) != "loom":
            fail("%s: the command %r does not start with loom" % (where, cmd))
            return None, None
        rest = cmd[1:]
        if rest[0] == "run":
            i = 1
            while i < len(rest) and rest[i].startswith("-"):
                f = rest[i]
                if f == "--":
                    i += 1
                    break
                if f not in self.run_flags:
                    fail("%s: loom run has no option %s (loom run --help)" % (where, f))
                    return None, None
                if self.run_flags[f]:
                    if i + 1 >= len(rest):
                        fail("%s: loom run %s needs a value" % (where, f))
                        return None, None
                    run[f] = rest[i + 1]
                    i += 2
                else:
                    run[f] = True
                    i += 1
            prog = rest[i:]
            if not prog or os.path.basename(prog[0]) != "loom":
                fail("%s: loom run's program is %r, not loom" % (where, prog))
                return None, None
            rest = prog[1:]
            run["argv"] = cmd[1:]
        if not rest or rest[0] != "train" or len(rest) < 2:
            fail("%s: %r is not `loom train CONFIG ...`" % (where, cmd))
            return None, None
        train = rest[1:]
        i = 1
        while i < len(train):
            f = train[i]
            if f not in self.train_flags:
                fail("%s: loom train has no option %s (loom train --help)" % (where, f))
                return None, None
            i += 2 if self.train_flags[f] else 1
        return run, train

    def config_check(self, files, name, cm_name, train, fail):
        """The ConfigMap's train.yaml through `loom config check` (with the
        command's --set overrides); returns the parsed config."""
        cm = [d for d in files.docs[name] if d.get("kind") == "ConfigMap" and d["metadata"].get("name") == cm_name]
        if not cm or "train.yaml" not in cm[0].get("data", {}):
            fail("%s: no ConfigMap %s with a key train.yaml" % (name, cm_name))
            return None
        text = cm[0]["data"]["train.yaml"]
        path = os.path.join(self.tmp, name + ".train.yaml")
        with open(path, "w") as f:
            f.write(text)
        sets = []
        for i, a in enumerate(train):
            if a == "--set" and i + 1 < len(train):
                sets += ["--set", train[i + 1]]
        r = subprocess.run([self.loom, "config", "check", path] + sets, capture_output=True, text=True)
        if r.returncode != 0:
            fail("%s: loom config check of ConfigMap %s: %s" % (name, cm_name, (r.stderr or r.stdout).strip()))
            return None
        r = subprocess.run([self.loom, "config", "show", path] + sets, capture_output=True, text=True)
        return yaml.safe_load(r.stdout) if r.returncode == 0 else None

    def check_env(self, where, container, fail):
        env = {}
        for e in container.get("env", []):
            n = e.get("name", "")
            env[n] = e
            if n.startswith("LOOM_"):
                if n not in self.env_names and n not in ENV_INIT:
                    fail("%s: environment variable %s is read nowhere in loom (src/)" % (where, n))
            elif n not in ENV_INIT and n not in ENV_OTHER and not n.startswith("OMPI_MCA_"):
                fail("%s: environment variable %s is not one loom, OpenMP, OpenBLAS or Open MPI reads" % (where, n))
            if "ALLOW_RUN_AS_ROOT" in n:
                fail("%s: %s: the image runs as its user, never root" % (where, n))
        return env

    def mounts(self, pod_spec, container):
        """mountPath -> ('configMap', name) / ('pvc', claim) / ..."""
        vols = {v["name"]: v for v in pod_spec.get("volumes", [])}
        out = {}
        for m in container.get("volumeMounts", []):
            v = vols.get(m.get("name"), {})
            if "configMap" in v:
                out[m["mountPath"]] = ("configMap", v["configMap"].get("name"))
            elif "persistentVolumeClaim" in v:
                out[m["mountPath"]] = ("pvc", v["persistentVolumeClaim"].get("claimName"))
            else:
                out[m["mountPath"]] = ("other", m.get("name"))
        return out

    def check_rank_pod(self, files, name, where, pod_spec, container, train, fail):
        """The pod where ranks run: the config is the ConfigMap's train.yaml,
        its run directory on the claim."""
        mounts = self.mounts(pod_spec, container)
        config = train[0]
        cm_dir = os.path.dirname(config)
        if mounts.get(cm_dir, ("",))[0] != "configMap" or os.path.basename(config) != "train.yaml":
            fail("%s: %s is not train.yaml of a ConfigMap mounted at %s" % (where, config, cm_dir))
            return
        cfg = self.config_check(files, name, mounts[cm_dir][1], train, fail)
        if cfg is None:
            return
        run_dir = (cfg.get("log") or {}).get("run_dir", "")
        on_pvc = [p for p, (k, _) in mounts.items() if k == "pvc" and (run_dir + "/").startswith(p.rstrip("/") + "/")]
        if not on_pvc:
            fail("%s: log.run_dir %r is not on the volume claim's mount (%s)" % (where, run_dir, ", ".join(p for p, (k, _) in mounts.items() if k == "pvc") or "none"))
        claims = [d["metadata"]["name"] for d in files.docs[name] if d.get("kind") == "PersistentVolumeClaim"]
        for p in on_pvc:
            if mounts[p][1] not in claims:
                fail("%s: the claim %s mounted at %s is not declared in %s" % (where, mounts[p][1], p, name))

    @staticmethod
    def cpus(q):
        q = str(q)
        return float(q[:-1]) / 1000 if q.endswith("m") else float(q)

    def check_mpijob(self, files, fail):
        job = files.one("mpijob.yaml", "MPIJob")
        spec = job["spec"]
        name = job["metadata"]["name"]
        slots = spec.get("slotsPerWorker", 1)
        reps = spec["mpiReplicaSpecs"]
        workers = reps.get("Worker", {}).get("replicas", 0)
        lpod = reps["Launcher"]["template"]["spec"]
        wpod = reps["Worker"]["template"]["spec"]
        lc, wc = lpod["containers"][0], wpod["containers"][0]
        run, train = self.parse_cmd(lc.get("command", []) + lc.get("args", []), "MPIJob launcher", fail)
        self.check_env("MPIJob launcher", lc, fail)
        self.check_env("MPIJob worker", wc, fail)
        if run is None:
            return
        if run.get("--hostfile") != "/etc/mpi/hostfile":
            fail("MPIJob launcher: loom run --hostfile is %r, not the operator's /etc/mpi/hostfile" % run.get("--hostfile"))
        n = run.get("-n", run.get("--np"))
        if n is None or not isinstance(slots, int) or not isinstance(workers, int) or int(n) != workers * slots:
            fail("MPIJob: loom run -n %s, but Worker replicas x slotsPerWorker = %s x %s" % (n, workers, slots))
        # A worker pod lost is made again by the operator, which takes tens
        # of seconds: restarts in quicker succession find its name without
        # a pod and use up --max-restarts (seen: all 3 within 4 s).
        try:
            delay = float(run.get("--restart-delay", "1"))
        except ValueError:
            delay = 0
        if delay < 30:
            fail("MPIJob launcher: loom run --restart-delay %s is under 30 s, shorter than the operator takes to make a lost worker pod again" % run.get("--restart-delay", "1 (the default)"))
        threads = run.get("--threads")
        limit = wc.get("resources", {}).get("limits", {}).get("cpu")
        if threads is None or limit is None or not isinstance(slots, int) or int(threads) * slots != self.cpus(limit):
            fail("MPIJob: loom run --threads %s x slotsPerWorker %s != the workers' cpu limit %s" % (threads, slots, limit))
        # The hostfile as the operator writes it, through loom run itself.
        hostfile = os.path.join(self.tmp, "hostfile")
        with open(hostfile, "w") as f:
            for i in range(workers if isinstance(workers, int) else 0):
                f.write("%s-worker-%d.%s-worker.default.svc slots=%s\n" % (name, i, name, slots))
        argv = [a if a != "/etc/mpi/hostfile" else hostfile for a in run["argv"]]
        argv.insert(1, "--dry-run")
        r = subprocess.run([self.loom] + argv, capture_output=True, text=True)
        if r.returncode != 0:
            fail("MPIJob launcher: loom %s: exit code %d: %s" % (" ".join(argv), r.returncode, (r.stderr or r.stdout).strip()[-300:]))
        elif threads is not None and "LOOM_THREADS=%s OMP_NUM_THREADS=%s" % (threads, threads) not in r.stdout:
            fail("MPIJob launcher: loom run --dry-run gives other thread counts: %s" % r.stdout.strip().splitlines()[-1])
        # The ranks run on the workers: the config and the run directory
        # must be there.
        self.check_rank_pod(files, "mpijob.yaml", "MPIJob worker", wpod, wc, train, fail)
        # sshd of the image, as the user the operator's Secret is mounted for.
        ssh = spec.get("sshAuthMountPath", "")
        wcmd = [str(c) for c in wc.get("command", []) + wc.get("args", [])]
        cf = files.containerfile
        if ssh != "/home/loom/.ssh" or "HostKey %s/id_rsa" % ssh not in cf:
            fail("MPIJob: sshAuthMountPath %r is not the .ssh of the image's user (HostKey in the Containerfile)" % ssh)
        if wcmd[:2] != ["/usr/sbin/sshd", "-De"] or "-f" not in wcmd or wcmd[wcmd.index("-f") + 1 :][:1] != ["/home/loom/.sshd_config"]:
            fail("MPIJob worker: runs %r, not the image's sshd (/usr/sbin/sshd -De -f /home/loom/.sshd_config)" % wcmd)
        port = wc.get("readinessProbe", {}).get("tcpSocket", {}).get("port")
        if port is None or len(re.findall(r"\bPort %s\b" % port, cf)) != 2:
            fail("MPIJob worker: readiness port %s is not the Port of the image's sshd and ssh client" % port)
        for role, pod in (("launcher", lpod), ("worker", wpod)):
            if pod.get("securityContext", {}).get("runAsUser") != RUN_USER_UID:
                fail("MPIJob %s: runAsUser is not the image's user %d" % (role, RUN_USER_UID))

    def check_indexed(self, files, fail):
        job = files.one("indexed-job.yaml", "Job")
        svc = files.one("indexed-job.yaml", "Service")
        name = job["metadata"]["name"]
        spec = job["spec"]
        pod = spec["template"]["spec"]
        c = pod["containers"][0]
        env = self.check_env("Job", c, fail)
        run, train = self.parse_cmd(c.get("command", []) + c.get("args", []), "Job", fail)
        if train is not None:
            self.check_rank_pod(files, "indexed-job.yaml", "Job", pod, c, train, fail)
        if spec.get("completionMode") != "Indexed":
            fail("Job: completionMode is not Indexed")
        val = {k: e.get("value") for k, e in env.items()}
        ws = val.get("WORLD_SIZE")
        if ws is None or not (str(ws) == str(spec.get("completions")) == str(spec.get("parallelism"))):
            fail("Job: WORLD_SIZE %s, completions %s, parallelism %s differ" % (ws, spec.get("completions"), spec.get("parallelism")))
        if val.get("LOOM_INIT") != "env://":
            fail("Job: LOOM_INIT is %r, not env://" % val.get("LOOM_INIT"))
        if str(val.get("LOCAL_RANK")) != "0":
            fail("Job: LOCAL_RANK is %r, not 0 (one rank per pod)" % val.get("LOCAL_RANK"))
        rank = env.get("RANK", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if rank != COMPLETION_INDEX:
            fail("Job: RANK comes from %r, not the completion index %s" % (rank, COMPLETION_INDEX))
        # Rank 0 is pod JOB-0 under the headless Service named by subdomain.
        sub = pod.get("subdomain")
        if sub != svc["metadata"]["name"]:
            fail("Job: subdomain %r is not the Service %s" % (sub, svc["metadata"]["name"]))
        if val.get("MASTER_ADDR") != "%s-0.%s" % (name, sub):
            fail("Job: MASTER_ADDR %r is not pod 0, %s-0.%s" % (val.get("MASTER_ADDR"), name, sub))
        sspec = svc.get("spec", {})
        if sspec.get("clusterIP") != "None":
            fail("Service %s is not headless (clusterIP: None)" % svc["metadata"]["name"])
        sel = sspec.get("selector", {})
        labels = dict(spec["template"].get("metadata", {}).get("labels", {}))
        labels.update({"job-name": name, "batch.kubernetes.io/job-name": name})  # the Job controller's
        if not sel or any(labels.get(k) != v for k, v in sel.items()):
            fail("Service %s: selector %s does not match the Job's pods" % (svc["metadata"]["name"], sel))
        port = str(val.get("MASTER_PORT"))
        if port not in [str(p.get("port")) for p in sspec.get("ports", [])] or port not in [str(p.get("containerPort")) for p in c.get("ports", [])]:
            fail("Job: MASTER_PORT %s is not a port of the Service and the container" % port)
        for n in ("LOOM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            ref = env.get(n, {}).get("valueFrom", {}).get("resourceFieldRef", {})
            if ref.get("resource") != "limits.cpu" or ref.get("containerName") != c.get("name"):
                fail("Job: %s does not come from the container's cpu limit" % n)
        # A replaced pod's rendezvous must outlast the survivors' watchdog
        # (they leave only after LOOM_COMM_TIMEOUT) and a pod's start, or it
        # gives up just as the new group forms: another failed pod each time.
        try:
            rdzv = float(val.get("LOOM_RDZV_TIMEOUT", 300))
            comm = float(val.get("LOOM_COMM_TIMEOUT", 600))
        except (TypeError, ValueError):
            rdzv, comm = 0, 0
        if rdzv < comm + 60:
            fail("Job: LOOM_RDZV_TIMEOUT %s is not at least LOOM_COMM_TIMEOUT %s + 60 s (a pod's start)" % (val.get("LOOM_RDZV_TIMEOUT", "300 (the default)"), val.get("LOOM_COMM_TIMEOUT", "600 (the default)")))
        if "cpu" not in c.get("resources", {}).get("limits", {}):
            fail("Job: the container has no cpu limit (the thread count comes from it)")
        try:
            if int(spec.get("backoffLimit", 6)) < int(ws):
                fail("Job: backoffLimit %s is less than one whole-job restart (WORLD_SIZE %s pods)" % (spec.get("backoffLimit"), ws))
        except (TypeError, ValueError):
            pass
        if pod.get("restartPolicy") != "Never" and spec.get("podFailurePolicy"):
            fail("Job: podFailurePolicy needs restartPolicy Never")
        if pod.get("securityContext", {}).get("runAsUser") != RUN_USER_UID:
            fail("Job: runAsUser is not the image's user %d" % RUN_USER_UID)

    def check_claims(self, files, fail):
        a = files.one("mpijob.yaml", "PersistentVolumeClaim")
        b = files.one("indexed-job.yaml", "PersistentVolumeClaim")
        if a["metadata"]["name"] == b["metadata"]["name"] and a != b:
            fail("the claim %s differs between mpijob.yaml and indexed-job.yaml (applying both would change it)" % a["metadata"]["name"])
        for d in (a, b):
            if "ReadWriteMany" not in d.get("spec", {}).get("accessModes", []):
                fail("claim %s is not ReadWriteMany (every rank writes its shards)" % d["metadata"]["name"])

    # -- the image ---------------------------------------------------------

    @staticmethod
    def stages(text):
        """The packages of each stage's `apt-get install` (comments and
        line continuations removed)."""
        lines = []
        for line in text.splitlines():
            if line.lstrip().startswith("#"):
                continue
            lines.append(line)
        joined = re.sub(r"\\\n", " ", "\n".join(lines))
        out = []
        for stage in re.split(r"^FROM ", joined, flags=re.M)[1:]:
            pkgs = []
            for m in re.finditer(r"apt-get install ([^&\n]*)", stage):
                pkgs += [w for w in m.group(1).split() if not w.startswith("-")]
            out.append(pkgs)
        return out

    def packages_missing(self, pkgs):
        """Those of pkgs apt-cache does not know (one call for the new ones:
        each call reads every package list, about a second)."""
        new = sorted(set(p for p in pkgs if p not in self.pkgs_exist))
        if new:
            r = subprocess.run(["apt-cache", "show", "--no-all-versions"] + new, capture_output=True, text=True)
            found = set(re.findall(r"^Package: (\S+)$", r.stdout, flags=re.M))
            for p in new:
                self.pkgs_exist[p] = p in found
        return [p for p in pkgs if not self.pkgs_exist[p]]

    def needed_packages(self):
        """The Debian packages of the libraries the loom binary links
        (NEEDED), or None when that cannot be said here (no readelf/dpkg, or
        a binary not built by GCC as the image's is)."""
        try:
            comment = subprocess.run(["readelf", "-p", ".comment", self.loom], capture_output=True, text=True).stdout
            dyn = subprocess.run(["readelf", "-d", self.loom], capture_output=True, text=True).stdout
            ldd = subprocess.run(["ldd", self.loom], capture_output=True, text=True).stdout
        except OSError:
            return None
        if "GCC" not in comment or "clang" in comment:
            return None
        paths = dict(re.findall(r"^\s*(\S+) => (\S+)", ldd, flags=re.M))
        pkgs = {}
        for lib in re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn):
            if re.match(r"lib(a|ub|t|l)san", lib):
                return None  # a sanitizer build: not what the image builds
            path = paths.get(lib)
            if not path:
                continue
            r = subprocess.run(["dpkg", "-S", os.path.realpath(path)], capture_output=True, text=True)
            if r.returncode != 0:
                pkgs[lib] = None
                continue
            pkg = r.stdout.split(":")[0]
            ess = subprocess.run(["dpkg-query", "-W", "-f=${Essential}", pkg], capture_output=True, text=True).stdout
            pkgs[lib] = None if ess.strip() == "yes" else pkg
        return pkgs

    def check_image(self, files, fail, needed):
        cf = files.containerfile
        st = self.stages(cf)
        if len(st) != 2:
            fail("Containerfile: %d stages with apt-get install, expected 2 (build, image)" % len(st))
            return
        build, image = st
        deps = open(os.path.join(self.src, "scripts", "install-deps.sh")).read()
        listed = set(re.findall(r"^\s+([a-z0-9][a-z0-9.+-]+)\s+#", deps.split("PKGS=(")[1].split("\n)")[0], flags=re.M))
        for p in build:
            if p not in listed:
                fail("Containerfile: the build stage installs %s, which scripts/install-deps.sh does not" % p)
        if self.apt:
            for p in self.packages_missing(build + image):
                fail("Containerfile: no package %s in this machine's Debian (apt-cache show)" % p)
        if needed:
            for lib, pkg in sorted(needed.items()):
                if pkg and pkg not in image:
                    fail("Containerfile: loom needs %s (package %s), which the image does not install" % (lib, pkg))
        for must in ("make build", "useradd --create-home --uid %d" % RUN_USER_UID, "USER loom", "openmpi-bin"):
            if must not in cf:
                fail("Containerfile: no %r" % must)
        if "ALLOW_RUN_AS_ROOT" in re.sub(r"^\s*#.*$", "", cf, flags=re.M):
            fail("Containerfile: sets Open MPI's run-as-root variables")

    def check_all(self, files, needed):
        failures = []
        fail = failures.append
        for f in (self.check_schemas, self.check_mpijob, self.check_indexed, self.check_claims):
            try:
                f(files, fail)
            except Check as e:
                fail(str(e))
            except (KeyError, IndexError, TypeError, AttributeError) as e:
                fail("%s: the files lack something it reads: %s %s" % (f.__name__, type(e).__name__, e))
        self.check_image(files, fail, needed)
        return failures


# Each breaks one thing in a copy of the files; the checks must report it
# (the message must contain the second field).
def _env(files, name, var):
    docs = files.docs[name]
    c = [d for d in docs if d["kind"] == "Job"][0]["spec"]["template"]["spec"]["containers"][0]
    return [e for e in c["env"] if e["name"] == var][0]


def _mpi(files):
    return files.one("mpijob.yaml", "MPIJob")["spec"]


def _idx(files):
    return files.one("indexed-job.yaml", "Job")["spec"]


def _cm(files, name):
    return files.one(name, "ConfigMap")["data"]


def _sub(files, what, old, new):
    assert old in files.containerfile, old
    files.containerfile = files.containerfile.replace(old, new, 1)


MUTATIONS = [
    ("a Job field misspelt", "Kubernetes 1.29 schema", lambda f: _idx(f).update(completion=4)),
    ("a pod condition without status (required up to 1.29)", "Kubernetes 1.29 schema", lambda f: _idx(f)["podFailurePolicy"]["rules"][0]["onPodConditions"][0].pop("status")),
    ("parallelism differs", "parallelism", lambda f: _idx(f).update(parallelism=3)),
    ("WORLD_SIZE differs", "WORLD_SIZE", lambda f: _env(f, "indexed-job.yaml", "WORLD_SIZE").update(value="5")),
    ("RANK from another annotation", "RANK comes from", lambda f: _env(f, "indexed-job.yaml", "RANK")["valueFrom"]["fieldRef"].update(fieldPath="metadata.annotations['batch.kubernetes.io/job-index']")),
    ("MASTER_ADDR names no pod", "MASTER_ADDR", lambda f: _env(f, "indexed-job.yaml", "MASTER_ADDR").update(value="loom-fashion-idx-0.loom")),
    ("MASTER_PORT not served", "MASTER_PORT", lambda f: _env(f, "indexed-job.yaml", "MASTER_PORT").update(value="29501")),
    ("LOOM_INIT misspelt", "read nowhere", lambda f: _env(f, "indexed-job.yaml", "LOOM_INIT").update(name="LOOM_INITS")),
    ("a thread variable misspelt", "LOOM_THREAD ", lambda f: _env(f, "indexed-job.yaml", "LOOM_THREADS").update(name="LOOM_THREAD")),
    ("Service not headless", "headless", lambda f: files_service(f).pop("clusterIP")),
    ("rendezvous shorter than the watchdog", "LOOM_RDZV_TIMEOUT 300 is not", lambda f: _env(f, "indexed-job.yaml", "LOOM_RDZV_TIMEOUT").update(value="300")),
    ("restarts faster than a pod comes back", "--restart-delay 1 is under", lambda f: _launcher_cmd(f).__setitem__(_launcher_cmd(f).index("--restart-delay") + 1, "1")),
    ("train.yaml with a misspelt key", "loom config check", lambda f: _cm(f, "indexed-job.yaml").update({"train.yaml": _cm(f, "indexed-job.yaml")["train.yaml"].replace("every: 100", "evry: 100")})),
    ("run directory off the volume", "run_dir", lambda f: _cm(f, "mpijob.yaml").update({"train.yaml": _cm(f, "mpijob.yaml")["train.yaml"].replace("run_dir: /runs/", "run_dir: /tmp/")})),
    ("loom train option misspelt", "loom train has no option", lambda f: _idx(f)["template"]["spec"]["containers"][0]["command"].append("--resum")),
    ("loom run -n differs", "-n 6", lambda f: _launcher_cmd(f).__setitem__(_launcher_cmd(f).index("-n") + 1, "6")),
    ("loom run option misspelt", "loom run has no option --thread", lambda f: _launcher_cmd(f).__setitem__(_launcher_cmd(f).index("--threads"), "--thread")),
    ("workers' cpu differs", "cpu limit 3", lambda f: _mpi(f)["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resources"]["limits"].update(cpu="3")),
    ("slotsPerWorker a string", "v2beta1 schema", lambda f: _mpi(f).update(slotsPerWorker="2")),
    ("an MPIJob field misspelt", "slotPerWorker", lambda f: _mpi(f).update(slotPerWorker=2)),
    ("two launchers", "Launcher replicas must be 1", lambda f: _mpi(f)["mpiReplicaSpecs"]["Launcher"].update(replicas=2)),
    ("an unknown MPI", "v2beta1 schema", lambda f: _mpi(f).update(mpiImplementation="OpenMpi")),
    ("a pod template field misspelt", "resurces", lambda f: _mpi(f)["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0].update(resurces={})),
    ("workers without the config", "is not train.yaml of a ConfigMap", lambda f: _mpi(f)["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["volumeMounts"].pop(0)),
    ("ssh keys mounted for root", "sshAuthMountPath", lambda f: _mpi(f).update(sshAuthMountPath="/root/.ssh")),
    ("claims differ", "differs between", lambda f: files_claim(f).update(resources={"requests": {"storage": "20Gi"}})),
    ("the image without libgomp1", "libgomp1", lambda f: _sub(f, "image", "        libgomp1 libopenmpi3", "        libopenmpi3")),
    ("a build package install-deps.sh lacks", "install-deps.sh does not", lambda f: _sub(f, "build", "build-essential cmake", "build-essential gcc-12 cmake")),
    ("a package Debian lacks", "apt-cache show", lambda f: _sub(f, "image", "        libdnnl2 ", "        libdnnl3 ")),
]


def files_service(f):
    return f.one("indexed-job.yaml", "Service")["spec"]


def files_claim(f):
    return f.one("indexed-job.yaml", "PersistentVolumeClaim")["spec"]


def _launcher_cmd(f):
    return _mpi(f)["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]


def main():
    loom, src, tmp = sys.argv[1:4]
    ck = Checker(loom, src, tmp)
    files = Files(src)
    needed = ck.needed_packages()
    print("schemas: Kubernetes %s (kubernetes-validate %s, strict), MPIJob kubeflow.org/v2beta1 (this test's schema)" % (" and ".join(ck.versions), kv.__version__))
    if needed is None:
        print("note: the libraries of %s are not checked against the image (not a GCC build, or no readelf/dpkg)" % loom)
    if not ck.apt:
        print("note: apt-cache has no package lists here: the packages' existence is not checked")
    failures = ck.check_all(files, needed)
    for f in failures:
        print("FAILED: " + f)
    if not failures:
        print("ok: examples/k8s/{mpijob,indexed-job}.yaml and Containerfile pass every check")
    missed = 0
    for what, expect, mutate in MUTATIONS:
        if expect == "apt-cache show" and not ck.apt:
            continue
        if expect == "libgomp1" and not needed:
            continue
        broken = copy.deepcopy(files)
        mutate(broken)
        got = ck.check_all(broken, needed)
        if not any(expect in g for g in got):
            missed += 1
            print("FAILED: broken on purpose (%s), not reported as %r; got: %s" % (what, expect, json.dumps(got)[:400]))
    if not missed:
        print("ok: each of %d files broken on purpose is reported" % len(MUTATIONS))
    return 1 if failures or missed else 0


if __name__ == "__main__":
    sys.exit(main())
