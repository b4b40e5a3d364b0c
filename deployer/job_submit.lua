--[[
linkwise job_submit.lua: hold new jobs of the partitions a live `linkwise serve --mode active`
manages, tagged so that the loop (and only the loop) places and releases them.

Install: copy beside slurm.conf, set `JobSubmitPlugins=lua` in slurm.conf, set LEASE_DIR below
to the cluster's lease directory (the loop logs it as `job_submit_lua_lease_dir` when it takes
its lease: `<lease root>/<ClusterName>-<SlurmctldHost>-<SlurmctldPort>`, by default below
/var/lib/linkwise/leases), then `scontrol reconfigure`. The loop must run on this host (the
plugin checks that the lease's owner process still runs).

What it does:
- on submit, a job of a partition whose lease is live (`<LEASE_DIR>/<partition>.expires`:
  "expiry pid start host"; live while not expired, not released (expiry 0), and its owner
  process runs with that start time) is held (priority 0; Slurm shows JobHeldUser) and its
  AdminComment set to "linkwise:held", which users cannot set or change. A job with an explicit
  --nodelist, a user's own --hold, a job submitted to several partitions and a job with an
  administrator's comment are left alone.
- on modify, a release of a job tagged "linkwise:held" by an operator in LOOP_UIDS ends the
  tag with the release ("linkwise:released"); a release by anyone else is refused while the
  job's partition has a live lease (so a user cannot bypass the loop), allowed otherwise (the
  loop counts it as a bypass and ends the tag). A user's hold of a tagged job is refused (it
  would keep the tag, and a loop would release it); an administrator's hold is kept
  (JobHeldAdmin: the loop leaves it alone). A change of a tagged job's partition by anyone
  but an operator is refused while the job's partition has a live lease (it would take the job
  out of the loop's hold). Refusals read "Access/permission denied".

Fail-open: with no live loop nothing new is held, and the loop's watchdog releases what was
held for it (its lease is marked released first, then it sweeps twice), so Slurm's own
scheduler takes over even after `kill -9` of the loop.
]]

local LEASE_DIR = "/var/lib/linkwise/leases/CLUSTER-HOST-PORT"
local DEFAULT_PARTITION = "gpu" -- used only if slurm.conf names no Default=YES partition
local LOOP_UIDS = { [0] = true } -- operators whose releases are the loop's (root by default)
local HOLD_TAG = "linkwise:held"
local RELEASED_TAG = "linkwise:released"
local ESLURM_ACCESS_DENIED = 2002

local function read_line(path)
  local fh = io.open(path, "r")
  if fh == nil then return nil end
  local line = fh:read("*l")
  fh:close()
  return line
end

-- the start time (clock ticks since boot) of a running, non-zombie process; nil otherwise
local function proc_start(pid)
  local stat = read_line("/proc/" .. pid .. "/stat")
  if stat == nil then return nil end
  local rest = string.match(stat, ".*%)%s+(.*)")
  if rest == nil then return nil end
  local fields = {}
  for f in string.gmatch(rest, "%S+") do fields[#fields + 1] = f end
  if fields[1] == "Z" or fields[1] == "X" then return nil end
  return fields[20]
end

local function lease_live(partition)
  if not string.match(partition, "^[%w_][%w_%.%-]*$") then return false end
  local line = read_line(LEASE_DIR .. "/" .. partition .. ".expires")
  if line == nil then return false end
  local expiry, pid, start, host = string.match(line, "^(%d+) (%d+) (%d+) (%S+)")
  if expiry == nil or tonumber(expiry) <= os.time() then return false end
  local here = read_line("/proc/sys/kernel/hostname")
  if here ~= nil and here ~= host then return false end -- the owner cannot be checked
  return proc_start(pid) == start
end

-- the partition a job without --partition lands in (Default=YES in slurm.conf)
local function default_partition(part_list)
  for name, part in pairs(part_list or {}) do
    if part.flag_default == 1 then return name end
  end
  return DEFAULT_PARTITION
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  if job_desc.req_nodes ~= nil or job_desc.priority == 0 then
    return slurm.SUCCESS -- placed by its user, or the user's own hold: not the loop's
  end
  if job_desc.admin_comment ~= nil and job_desc.admin_comment ~= "" then
    return slurm.SUCCESS -- an administrator's job: left alone
  end
  local partition = job_desc.partition or default_partition(part_list)
  if lease_live(partition) then -- one partition only: with several, Slurm chooses
    job_desc.priority = 0 -- held: the loop places and releases it
    job_desc.admin_comment = HOLD_TAG
    slurm.log_info("linkwise: holding a job of partition %s for the live loop", partition)
  end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  if job_rec.admin_comment ~= HOLD_TAG then
    return slurm.SUCCESS
  end
  local moving = job_desc.partition ~= nil and job_desc.partition ~= job_rec.partition
  if moving and not LOOP_UIDS[modify_uid] then
    -- another partition would take the job out of the loop's hold (the loop would hand it
    -- to Slurm, or the user release it there): refused while a loop manages its partition
    for p in string.gmatch(job_rec.partition or DEFAULT_PARTITION, "[^,]+") do
      if lease_live(p) then
        slurm.log_info("linkwise: refused uid %d's partition change of job %s held for the "
          .. "live loop", modify_uid, tostring(job_rec.job_id))
        slurm.log_user("linkwise: this job is held for the live scheduling loop; its "
          .. "partition cannot change while the loop runs; cancel and resubmit it")
        return ESLURM_ACCESS_DENIED
      end
    end
  end
  if job_desc.priority == 0 and not LOOP_UIDS[modify_uid] then
    -- a user's hold would keep the tag (users cannot change an admin comment), so the
    -- loop would take it for its own and release it: refused instead of overridden later
    slurm.log_info("linkwise: refused uid %d's hold of job %s tagged for the live loop",
      modify_uid, tostring(job_rec.job_id))
    return ESLURM_ACCESS_DENIED
  end
  if job_desc.priority ~= slurm.INFINITE then
    return slurm.SUCCESS
  end
  if LOOP_UIDS[modify_uid] then
    job_desc.admin_comment = RELEASED_TAG -- the release and the end of the claim, at once
    return slurm.SUCCESS
  end
  local partition = job_rec.partition or DEFAULT_PARTITION
  for p in string.gmatch(partition, "[^,]+") do
    if lease_live(p) then
      slurm.log_info("linkwise: refused uid %d's release of job %s held for the live loop",
        modify_uid, tostring(job_rec.job_id))
      slurm.log_user("linkwise: this job is held for the live scheduling loop, which places "
        .. "and releases it; cancel it or ask an administrator")
      return ESLURM_ACCESS_DENIED
    end
  end
  return slurm.SUCCESS -- no live loop: the user may release it (the loop counts a bypass)
end

slurm.log_info("linkwise job_submit.lua loaded")
return slurm.SUCCESS
