-- Argo CD health of a torchyard.dev OnlineEndpoint, from the status the operator writes
-- (torchyard.status.endpoints): status.phase, the Ready condition, observedGeneration.
-- Healthy once every Pod of the spec serves (Ready), Degraded when a serving Pod fails
-- (Degraded: older Pods still serve; Failed: none does), Progressing while it waits for
-- its Environment or model, fetches the model, deploys or rolls out.
local hs = {}

local function ready_message(default)
  if obj.status.conditions ~= nil then
    for _, c in ipairs(obj.status.conditions) do
      if c.type == "Ready" and c.message ~= nil and c.message ~= "" then
        return c.message
      end
    end
  end
  return default
end

if obj.status == nil or obj.status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the torchyard operator"
  return hs
end

local phase = obj.status.phase
local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and observed ~= nil and observed < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. generation
  return hs
end

if phase == "Ready" then
  hs.status = "Healthy"
  hs.message = ready_message("Ready")
elseif phase == "Failed" or phase == "Degraded" then
  hs.status = "Degraded"
  local default = phase
  if obj.status.message ~= nil and obj.status.message ~= "" then
    default = obj.status.message
  end
  hs.message = ready_message(default)
else
  -- Pending, Preparing, Deploying or Updating.
  hs.status = "Progressing"
  hs.message = ready_message(phase)
end
return hs
