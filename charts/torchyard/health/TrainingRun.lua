-- Argo CD health of a torchyard.dev TrainingRun, from the status the operator writes
-- (torchyard.status.trainingruns): status.phase, status.conditions, observedGeneration.
-- A run is judged like a Job: Healthy once it succeeded, Degraded once it failed,
-- Suspended while its gang waits for capacity (phase Queued: Argo CD shows a Job that
-- Kueue holds back the same way), Progressing in every other phase.
local hs = {}

local function condition(type)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == type then
      return c
    end
  end
  return nil
end

local function message(type, default)
  local c = condition(type)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return default
end

if obj.status == nil or obj.status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the torchyard operator to accept the run"
  return hs
end

local phase = obj.status.phase
local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and observed ~= nil and observed < generation
    and phase ~= "Succeeded" and phase ~= "Failed" then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. generation
  return hs
end

if phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = message("Succeeded", "Succeeded")
  local model = obj.status.model
  if model ~= nil and model.name ~= nil and model.version ~= nil then
    hs.message = hs.message .. "; registered model " .. model.name .. " version " .. model.version
  end
elseif phase == "Failed" then
  hs.status = "Degraded"
  local failure = obj.status.failure
  local default = "Failed"
  if failure ~= nil and failure.message ~= nil and failure.message ~= "" then
    default = failure.message
  end
  hs.message = message("Failed", default)
elseif phase == "Queued" then
  hs.status = "Suspended"
  hs.message = message("Admitted", "Queued: waiting for capacity")
elseif phase == "Preparing" then
  hs.status = "Progressing"
  hs.message = message("EnvironmentReady", "Preparing the Environment")
elseif phase == "Running" then
  hs.status = "Progressing"
  hs.message = message("Running", "Running")
elseif phase == "Finalizing" then
  hs.status = "Progressing"
  hs.message = message("Succeeded", "Archiving outputs and registering the model")
else
  -- Pending: creating the node Pods, or restarting the gang after a failure.
  hs.status = "Progressing"
  hs.message = message("Running", message("Admitted", phase))
end
return hs
