--[[
linkwise job_submit.lua: hold new jobs of the partitions a live `linkwise serve --mode active`
manages, so the loop can place them (ReqNodeList + NumNodes) and release them.

Install: copy beside slurm.conf, set `JobSubmitPlugins=lua` in slurm.conf, point LEASE_EXPIRES
below at the loop's lease file plus ".expires" (`<state-dir>/lease-<partitions>.json.expires`,
written by the loop every cycle: line 1 the lease's expiry in epoch seconds, 0 once released;
line 2 the managed partitions, comma-separated), then `scontrol reconfigure`.

Fail-open: a job is held only while the lease is fresh. When the loop stops, crashes or is
killed, the lease expires, nothing new is held, and the watchdog releases what was held:
Slurm's own scheduler takes over. Jobs submitted with an explicit --nodelist are left alone.
]]

local LEASE_EXPIRES = "/var/lib/linkwise/serve/lease-gpu.json.expires"
local DEFAULT_PARTITION = "gpu" -- the partition a job without --partition lands in

local function read_lease()
  local fh = io.open(LEASE_EXPIRES, "r")
  if fh == nil then return 0, {} end
  local expiry = tonumber(fh:read("*l") or "0") or 0
  local parts = {}
  for p in string.gmatch(fh:read("*l") or "", "[^,]+") do parts[p] = true end
  fh:close()
  return expiry, parts
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local expiry, managed = read_lease()
  if expiry <= os.time() then
    return slurm.SUCCESS -- no live loop: Slurm schedules as usual
  end
  local partition = job_desc.partition or DEFAULT_PARTITION
  for p in string.gmatch(partition, "[^,]+") do
    if managed[p] and job_desc.req_nodes == nil then
      job_desc.priority = 0 -- held: the loop places and releases it
      slurm.log_info("linkwise: holding a job of partition %s for the live loop", p)
      return slurm.SUCCESS
    end
  end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end

slurm.log_info("linkwise job_submit.lua loaded")
return slurm.SUCCESS
