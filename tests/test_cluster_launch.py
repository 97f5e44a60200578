"""Can the head's autoscaler launch every worker node type of cluster.yaml, and does each boot complete?

- A node type whose `ImageId` is `resolve:ssm:<parameter>` is launched by the head's autoscaler, which passes the
  ImageId to EC2's RunInstances unchanged (`ray/autoscaler/_private/aws/node_provider.py`); EC2 resolves the
  parameter with the caller's permissions, so the head's role needs `ssm:GetParameters` on it. Ray's default head
  role (`ray-autoscaler-v1`, `aws/config.py`) carries EC2 and S3 full access only, so the head names its own
  instance profile, whose policy is committed under aws/ and created by the commands of docs/cluster.md.
- A node type's `worker_setup_commands` replace the global ones: Ray's `prepare_config` merges `setup_commands` into
  the global `worker_setup_commands` only, and the autoscaler hands a node the node type's list when it has one
  (`StandardAutoscaler._get_node_type_specific_fields`). The effective list of each worker type is computed here with
  that very code.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
import ray
import yaml
from ray.autoscaler._private.autoscaler import StandardAutoscaler
from ray.autoscaler._private.util import prepare_config, validate_config
from ray.autoscaler.tags import TAG_RAY_USER_NODE_TYPE

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "cluster.md"


@pytest.fixture(scope="module")
def cluster() -> dict:
    return yaml.safe_load((REPO / "cluster.yaml").read_text())


def prepared(cluster: dict) -> dict:
    """What `ray up` hands the head's autoscaler: Ray's defaults merged, validated."""
    config = prepare_config(copy.deepcopy(cluster))
    validate_config(config)
    return config


def effective_setup_commands(config: dict, node_type: str) -> list[str]:
    """The setup commands Ray's autoscaler runs on a new node of `node_type` (its own code, its node-tag lookup)."""
    provider = SimpleNamespace(node_tags=lambda node_id: {TAG_RAY_USER_NODE_TYPE: node_type})
    autoscaler = SimpleNamespace(config=config, provider=provider, available_node_types=config["available_node_types"])
    return StandardAutoscaler._get_node_type_specific_fields(autoscaler, "node-1", "worker_setup_commands")


def wildcard(pattern: str, value: str, ignore_case: bool) -> bool:
    """IAM's wildcards in Action and Resource: `*` any run of characters (none included), `?` one character."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, re.IGNORECASE if ignore_case else 0) is not None


def allows(policy: dict, action: str, resource: str) -> bool:
    """Whether an identity policy's Allow statements grant `action` (names ignore case) on `resource` (ARNs do not).
    The committed policies use no Deny, NotAction, NotResource or Condition; one that did fails here."""
    statements = policy["Statement"] if isinstance(policy["Statement"], list) else [policy["Statement"]]
    for st in statements:
        assert st["Effect"] == "Allow" and not {"Condition", "NotAction", "NotResource"} & set(st), st
        actions = [st["Action"]] if isinstance(st["Action"], str) else st["Action"]
        resources = [st["Resource"]] if isinstance(st["Resource"], str) else st["Resource"]
        if any(wildcard(a, action, True) for a in actions) and any(wildcard(r, resource, False) for r in resources):
            return True
    return False


def ssm_parameters(config: dict) -> dict[str, str]:
    """{node type: SSM parameter name} for every node type booting from `resolve:ssm:<name>[:version]`."""
    found = {}
    for name, node in config["available_node_types"].items():
        image = str(node["node_config"].get("ImageId", ""))
        if image.startswith("resolve:ssm:"):
            found[name] = re.sub(r":\d+$", "", image[len("resolve:ssm:"):])
    return found


def guide_commands() -> list[list[str]]:
    """The `aws iam ...` commands of the cluster guide's shell blocks, split as the shell would."""
    blocks = re.findall(r"```sh\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.DOTALL)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [shlex.split(line, comments=True) for line in lines if line.strip().startswith("aws iam ")]


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_the_head_runs_with_an_instance_profile_whose_policy_lets_ec2_resolve_every_ssm_image(cluster):
    config = prepared(cluster)
    head = config["available_node_types"][config["head_node_type"]]["node_config"]
    # Ray's aws/config.py `_configure_iam_role` keeps a head node_config's own IamInstanceProfile and only otherwise
    # creates and attaches ray-autoscaler-v1 (EC2 + S3 full access): read from the installed Ray, not assumed
    ray_aws_config = (Path(ray.__file__).parent / "autoscaler" / "_private" / "aws" / "config.py").read_text()
    assert 'if "IamInstanceProfile" in head_node_config:' in ray_aws_config
    assert "IamInstanceProfile" in head, "the head would run under ray-autoscaler-v1, which has no ssm:GetParameters"
    profile = head["IamInstanceProfile"]["Name"]

    # the guide creates that profile, with a role holding the committed policy document
    commands = guide_commands()
    created = [c for c in commands if c[:3] == ["aws", "iam", "create-instance-profile"]]
    assert [option(c, "--instance-profile-name") for c in created] == [profile]
    added = next(c for c in commands if c[:3] == ["aws", "iam", "add-role-to-instance-profile"])
    assert option(added, "--instance-profile-name") == profile
    role = option(added, "--role-name")
    create_role = next(c for c in commands if c[:3] == ["aws", "iam", "create-role"])
    assert option(create_role, "--role-name") == role
    trust = json.loads((REPO / option(create_role, "--assume-role-policy-document").removeprefix("file://")).read_text())
    assert allows_ec2_to_assume(trust)
    inline = [c for c in commands if c[:3] == ["aws", "iam", "put-role-policy"] and option(c, "--role-name") == role]
    policies = [json.loads((REPO / option(c, "--policy-document").removeprefix("file://")).read_text()) for c in inline]
    attached = {option(c, "--policy-arn") for c in commands
                if c[:3] == ["aws", "iam", "attach-role-policy"] and option(c, "--role-name") == role}
    # what Ray's default role gives its autoscaler (launch, tag and terminate instances), kept
    assert {"arn:aws:iam::aws:policy/AmazonEC2FullAccess", "arn:aws:iam::aws:policy/AmazonS3FullAccess"} <= attached
    assert "arn:aws:iam::aws:policy/AmazonEC2FullAccess" in ray_aws_config

    # every resolve:ssm: image of the cluster resolves under that role, in the cluster's region (public parameters
    # are owned by AWS: no account in their ARN)
    parameters = ssm_parameters(config)
    assert parameters, "no node type boots from resolve:ssm: (then this test has nothing to check: rewrite it)"
    region = config["provider"]["region"]
    for node_type, name in parameters.items():
        arn = f"arn:aws:ssm:{region}::parameter{name}"
        assert any(allows(p, "ssm:GetParameters", arn) for p in policies), (node_type, arn)


def allows_ec2_to_assume(trust: dict) -> bool:
    return any(st["Effect"] == "Allow" and st["Action"] == "sts:AssumeRole"
               and st["Principal"].get("Service") == "ec2.amazonaws.com" for st in trust["Statement"])


def test_the_policy_check_is_not_vacuous():
    """Control: Ray's default role's policies grant no ssm action; a policy for another parameter path does not
    cover the DLAMI's; a wildcard action does."""
    arn = "arn:aws:ssm:us-west-2::parameter/aws/service/deeplearning/ami/x86_64/some-ami/latest/ami-id"
    ec2_full = {"Statement": [{"Effect": "Allow", "Action": "ec2:*", "Resource": "*"}]}
    assert not allows(ec2_full, "ssm:GetParameters", arn)
    other_path = {"Statement": [{"Effect": "Allow", "Action": "ssm:GetParameters",
                                 "Resource": "arn:aws:ssm:*::parameter/aws/service/ami-amazon-linux-latest/*"}]}
    assert not allows(other_path, "ssm:GetParameters", arn)
    assert allows({"Statement": {"Effect": "Allow", "Action": "ssm:Get*", "Resource": "*"}}, "ssm:GetParameters", arn)


def test_each_worker_type_runs_the_global_setup_then_its_own(cluster):
    config = prepared(cluster)
    setup = cluster.get("setup_commands", [])
    assert setup, "no global setup_commands: nothing for a node type to lose"
    for node_type in config["available_node_types"]:
        if node_type == config["head_node_type"]:
            continue
        commands = effective_setup_commands(config, node_type)
        assert commands[:len(setup)] == setup, (node_type, commands)  # the editable install, first
    gpu = effective_setup_commands(config, "gpu_worker")
    assert gpu[len(setup):] == ["cd ~/quorum && python -m train.cuda_check"]  # then the driver check


def test_rays_merge_is_what_the_setup_check_assumes(cluster):
    """Control: a node type's own list is used alone (the global setup_commands are not prepended to it)."""
    broken = copy.deepcopy(cluster)
    broken["available_node_types"]["gpu_worker"]["worker_setup_commands"] = ["echo only this"]
    assert effective_setup_commands(prepared(broken), "gpu_worker") == ["echo only this"]
    # a node type without its own list gets the global setup_commands + worker_setup_commands
    del broken["available_node_types"]["gpu_worker"]["worker_setup_commands"]
    config = prepared(broken)
    assert effective_setup_commands(config, "gpu_worker") == cluster["setup_commands"] + cluster["worker_setup_commands"]


def test_the_first_hour_on_a_gpu_names_the_check_the_profile_and_the_wait_for_a_gpu_worker():
    text = GUIDE.read_text(encoding="utf-8")
    first_hour = text[text.index("## The first hour on a GPU"):]
    end = first_hour.find("\n## ", 4)  # the section runs to the next heading or the page's end
    first_hour = first_hour if end < 0 else first_hour[:end]
    for needed in ("python -m bench.gpu_check", "quorum-ray-head", "ray up cluster.yaml", "ray monitor cluster.yaml",
                   "gpu_worker"):
        assert needed in first_hour, needed
    never_ran = text[text.index("## What has never run on a GPU"):text.index("## The first hour on a GPU")]
    assert "bench.gpu_check" in never_ran and "quorum-ray-head" in never_ran
